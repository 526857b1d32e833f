"""`python -m vllm_standin.api_server --model MODEL [--flags]`, as
`python -m vllm.entrypoints.openai.api_server` of older releases."""
import sys

if __name__ == "__main__":
    from vllm_standin.main import main  # run as a module of the installed package
    sys.exit(main())
