"""Which SGLang release the host's tree is: ``sglang_version()`` (its dist-info, else
sglang/version.py) and ``version_tuple()`` (the first three numbers)."""
import importlib


def version_tuple():
    parts = []
    for piece in sglang_version().split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def sglang_version():
    try:
        from importlib import metadata
        return metadata.version("sglang")
    except Exception:
        try:
            return importlib.import_module("sglang.version").__version__
        except Exception:
            return "unknown"
