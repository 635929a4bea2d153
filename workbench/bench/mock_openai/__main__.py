"""`python -m workbench.bench.mock_openai`: the mock server as a program (`serve.main`)."""

from workbench.bench.mock_openai.serve import main

raise SystemExit(main())
