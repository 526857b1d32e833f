"""`python -m vllm_standin serve MODEL [--flags]`, as `vllm serve`."""
import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())
