"""vLLM's log prefix, as each release family writes it, is stripped whole: the message that the
profile's signatures match is what is left.  The process names are the wheels':
0.10.0 `_add_prefix(sys.stdout, f"VllmWorker rank={rank}", pid)` (multiproc_executor.py), with
the colour codes of vllm/executor/multiproc_worker_utils.py; 0.10.1
`decorate_logs(f"VllmWorker {suffix}")`; 0.10.2+ `Worker_TP<r>`, `EngineCore_DP0`, `APIServer`;
from 0.20 no colour codes."""
from __future__ import annotations

import pytest

from fleetpatch.engines.vllm import PROFILE

CYAN, RESET = "\x1b[1;36m", "\x1b[0;0m"
MESSAGE = "Directly load the compiled graph(s) for dynamic shape from the cache, took 0.5 s"
HEAD = "INFO 12-06 02:33:52 [backends.py:162] "


@pytest.mark.parametrize("prefix", [
    f"{CYAN}(VllmWorker rank=0 pid=123){RESET} ",       # 0.10.0 workers
    f"{CYAN}(VllmWorker rank=1 pid=9){RESET} ",
    f"{CYAN}(VllmWorker TP0 pid=123){RESET} ",          # 0.10.1 workers (tensor parallel)
    f"{CYAN}(VllmWorker PP1_TP0 pid=123){RESET} ",      # 0.10.1 workers (pipeline and tensor parallel)
    f"{CYAN}(EngineCore_0 pid=77){RESET} ",             # 0.10.0 EngineCore (current_process().name)
    f"{CYAN}(Worker_TP1 pid=123){RESET} ",              # 0.10.2
    f"{CYAN}(EngineCore_DP0 pid=77){RESET} ",
    f"{CYAN}(APIServer pid=5){RESET} ",
    "(Worker_TP0 pid=123) ",                            # 0.20 and later: no colour
    "(EngineCore pid=77) ",
    "(APIServer pid=5) ",
    "",                                                  # a process without a prefix (0.10.0's API server)
])
def test_each_release_familys_prefix_is_stripped_whole(prefix):
    assert PROFILE.strip_prefix(prefix + HEAD + MESSAGE + "\n") == MESSAGE


def test_a_line_that_is_not_vllms_is_left_as_it_is():
    line = 'INFO:     127.0.0.1:60804 - "POST /v1/completions HTTP/1.1" 200 OK'
    assert PROFILE.strip_prefix(line) == line
    # a parenthesis in a message is not a prefix
    odd = "(not a prefix pid=x) " + HEAD + MESSAGE
    assert PROFILE.strip_prefix(odd) == odd
