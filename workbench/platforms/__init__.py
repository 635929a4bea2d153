"""What the machine is (vLLM's `platforms`), torch-free at import.

    cpu_info.py   the CPU's model, ISA flags and cache sizes, and the fingerprint that measured
                  choices (the linear backends' autotune, the compiled-forward default) are
                  keyed by
    preflight.py  the hardware/software contract a measurement runs under (CPU, GPUs,
                  versions, git sha) and its fingerprint; `workbench preflight`
"""
