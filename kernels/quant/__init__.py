"""Weight-only quantized formats in plain PyTorch: storage layout, `quantize` and `dequantize`.

These are the references `kernels.triton.dequant_matmul` is tested against and the CPU forward
of the quantized linear layers (`workbench/layers/quantization/`), which import them from here.
    int8   per-output-channel symmetric scale          (kernels.quant.int8)
    int4   per-group asymmetric scale and zero, packed  (kernels.quant.int4)
"""
