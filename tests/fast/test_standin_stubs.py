"""The stand-ins' one family of import stubs (fleetpatch_standin_common.stubs): the inert `Stub`
the SGLang stand-in serves and the `ValueStub` that vLLM's real drafters compute with, and the
vLLM stand-in's install, which must carry the common package it imports them from."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from fleetpatch_demo.standins.common import stubs
from fleetpatch_demo.standins.vllm import install


def test_a_value_stub_unpacks_to_as_many_values_as_asked_and_an_inert_one_to_none():
    a, b, c = stubs.ValueStub("model")()
    assert [repr(v) for v in (a, b, c)] == ["<stub model()[0]>", "<stub model()[1]>", "<stub model()[2]>"]
    assert isinstance(a, stubs.ValueStub), "what a value stub hands out is of its family"
    assert list(stubs.Stub("model")()) == []


def test_a_value_stub_equals_concrete_values_and_compares_as_a_large_number_an_inert_one_does_not():
    value, inert = stubs.ValueStub("hidden_size"), stubs.Stub("hidden_size")
    assert value == 4096 and not value != 4096 and value > 0 and not value < 10
    assert value != stubs.ValueStub("other") and value != None  # noqa: E711 (the == operator is the point)
    assert inert != 4096 and not inert > 0 and inert == inert


def test_a_class_derived_from_a_value_stub_hands_out_value_stubs():
    class Drafter(stubs.ValueStub("torch.nn.Module")):
        pass

    x, y = Drafter().model(1)
    assert isinstance(x, stubs.ValueStub) and Drafter.missing == 1
    plain = stubs.Stub("torch.nn.Module")

    class Worker(plain):
        pass

    assert not isinstance(Worker().model, stubs.ValueStub) and isinstance(Worker().model, stubs.Stub)


def test_a_function_under_a_stubbed_decorator_runs_but_under_a_compiler_it_is_a_stub():
    def forward(x):
        return x + 1

    kept = stubs.Stub("torch.inference_mode")()(forward)
    assert kept is forward
    wrapped = stubs.ValueStub("torch.inference_mode")()(forward)
    assert isinstance(wrapped, stubs.Decorated) and wrapped(1) == 2
    assert isinstance(stubs.ValueStub("triton.jit")(forward), stubs.ValueStub)


def test_the_vllm_standins_install_carries_the_common_stubs_and_serves_vllm_modules_as_value_stubs(tmp_path):
    site = tmp_path / "site"
    (site / "vllm" / "v1" / "spec_decode").mkdir(parents=True)
    (site / "vllm" / "_version.py").write_text('__version__ = "0.11.0"\n')
    (site / "vllm" / "v1" / "spec_decode" / "__init__.py").write_text("")
    (site / "vllm" / "v1" / "spec_decode" / "eagle.py").write_text(textwrap.dedent("""\
        import torch
        from vllm.config import VllmConfig
        from vllm.logger import init_logger
        hidden, logits = torch.nn.Linear(4096)(1)
        """))
    install.install_standin(site)
    assert (site / "fleetpatch_standin_common" / "stubs.py").is_file()
    code = textwrap.dedent("""\
        import vllm_standin.stubs as stubs
        rules = stubs.rules(%r)
        rules.module_attrs["vllm.logger"] = {"init_logger": "the real one"}
        stubs.install(rules)
        import vllm.v1.spec_decode.eagle as eagle
        from fleetpatch_standin_common.stubs import ValueStub
        print(type(eagle.VllmConfig).__name__, type(eagle.hidden).__name__, eagle.init_logger,
              eagle.__file__.endswith("vllm/v1/spec_decode/eagle.py"))
        try:
            import a_module_no_host_has
        except ImportError:
            print("ImportError")
        """ % str(site))
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=site, capture_output=True, text=True,
                         env={"PYTHONPATH": str(site)}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["ValueStub ValueStub the real one True", "ImportError"], out.stdout
