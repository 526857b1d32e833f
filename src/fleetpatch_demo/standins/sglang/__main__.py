"""``python -m sglang_standin <SGLang's launch flags>``: the stand-in server, started as
SGLang is (``python -m sglang.launch_server ...``)."""
import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())
