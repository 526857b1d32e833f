"""Concrete stand-ins for helpers of sglang.srt.utils (and the distributed groups) whose
values matter to the tree's code: argument types, number helpers, a simulated H100's
memory and device, this process's TP rank and size (``RANK``, which the server updates
before each rank's work), process groups, cuda-graph batch sizes, the model class."""
import argparse
import json
import random
import socket
import sys
import traceback

from fleetpatch_standin_common.stubs import Stub, StubBase


def nullable_str(val):
    if not val or val == "None":
        return None
    return val


def json_list_type(value):
    try:
        return json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError("Invalid JSON list: %s. Please provide a valid JSON list." % value)


def parse_connector_type(url):
    import re
    m = re.match(r"(.+)://(.*)", url)
    return "" if m is None else m.group(1)


def is_no_spec_infer_or_topk_one(server_args):
    return server_args.speculative_eagle_topk is None or (
        server_args.speculative_eagle_topk == 1
        and (server_args.page_size == 1 or server_args.page_size is None))


def human_readable_int(value):
    """SI (k, M, G, T) and IEC (Ki, Mi, Gi, Ti) suffixes, as in SGLang."""
    import re
    from decimal import Decimal
    value = value.strip()
    si = {"k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12}
    iec = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    "Decimals are not allowed with IEC suffixes like '%s'." % suffix)
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "Invalid integer value: '%s'. Use a plain integer, SI suffixes (1k, 1M), or IEC "
            "suffixes (1Ki, 1Mi). Suffixes are case-sensitive." % value)


def next_power_of_2(n):
    return 1 << (n - 1).bit_length() if n > 0 else 1


def round_up(x, y):
    return ((x - 1) // y + 1) * y


def ceil_div(a, b):
    return (a + b - 1) // b


class EmptyContextManager(object):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def empty_context(*args, **kwargs):
    return EmptyContextManager()


_GPU_MEM = {"avail": 78.52}


def get_available_gpu_memory(*args, **kwargs):
    """Simulated free memory of an 80 GB GPU, shrinking a little per call."""
    _GPU_MEM["avail"] = max(1.0, round(_GPU_MEM["avail"] - random.uniform(0.01, 0.4), 2))
    return _GPU_MEM["avail"]


def get_device_memory_capacity(*args, **kwargs):
    return 81559.0


class _DeviceName(str):
    """"cuda", also as 0.5.19+'s runtime_context.get_device() config (its .device)."""

    @property
    def device(self):
        return str(self)


def get_device(*args, **kwargs):
    return _DeviceName("cuda")


def get_device_name(*args, **kwargs):
    return "NVIDIA H100 80GB HBM3"


def get_device_sm(*args, **kwargs):
    return 90


def get_device_capability(*args, **kwargs):
    return (9, 0)


def get_free_port(*args, **kwargs):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_release(*args, **kwargs):
    return (2, 9)


def get_exception_traceback():
    return "".join(traceback.format_exception(*sys.exc_info()))


def get_world_size(*args, **kwargs):
    return RANK["tp_size"]


def get_rank(*args, **kwargs):
    return RANK["tp_rank"]


RANK = {"tp_rank": 0, "tp_size": 1}


class Group(StubBase):
    """Simulated process group (tp_group, attention tp group, ...)."""

    def __init__(self, name="tp"):
        self.group_name = name

    @property
    def world_size(self):
        return RANK["tp_size"]

    @property
    def rank_in_group(self):
        return RANK["tp_rank"]

    @property
    def rank(self):
        return RANK["tp_rank"]

    @property
    def ranks(self):
        return list(range(RANK["tp_size"]))

    @property
    def first_rank(self):
        return 0

    @property
    def is_first_rank(self):
        return RANK["tp_rank"] == 0

    @property
    def last_rank(self):
        return RANK["tp_size"] - 1

    @property
    def is_last_rank(self):
        return RANK["tp_rank"] == RANK["tp_size"] - 1


def group_getter(name):
    def getter(*args, **kwargs):
        return Group(name)
    getter.__name__ = "get_%s_group" % name
    return getter


def get_batch_sizes_to_capture(model_runner, *args, **kwargs):
    """(capture_bs, compile_bs) like sglang.srt.model_executor.cuda_graph_runner."""
    sa = model_runner.server_args
    capture_bs = list(getattr(sa, "cuda_graph_bs", None) or [1, 2, 4, 8, 12, 16, 24, 32, 40, 48])
    max_bs = getattr(sa, "cuda_graph_max_bs", None)
    if isinstance(max_bs, int):
        capture_bs = [bs for bs in capture_bs if bs <= max_bs] or [1]
    capture_bs = sorted(set(capture_bs))
    compile_bs = ([bs for bs in capture_bs if bs <= sa.torch_compile_max_bs]
                  if getattr(sa, "enable_torch_compile", False) else [])
    return capture_bs, compile_bs


# Methods whose result is unpacked into a tuple.
def pair(*args, **kwargs):
    return (Stub("first"), Stub("second"))


def get_model_architecture(model_config, *args, **kwargs):
    """sglang.srt.model_loader.utils: (model class, architecture name). The class is
    a plain one, so that getattr(cls, "draft_parallel_spec", None) (0.5.23) sees
    no declaration, as for a model that makes none."""
    hf_config = getattr(model_config, "hf_config", None)
    archs = getattr(hf_config, "architectures", None) or ["LlamaForCausalLM"]
    return type(str(archs[0]), (object,), {}), archs[0]
