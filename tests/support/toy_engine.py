"""A second engine that exists only in the tests: "toyserve".

It is everything fleetpatch would need to support a new serving engine, in one
file: its files and code paths, how a launch picks a path, its ready line, its
log prefix, its failure line and which environment variables matter.  Nothing
in it is SGLang's: a message that shows an SGLang string when judging toyserve
proves some module outside `engines/sglang.py` still knows SGLang.

toyserve 2.x picks a decoder: `--decoder fast|slow|turbo|none`, else
$TOYSERVE_DECODER, else fast.  TurboDecoder inherits from FastDecoder.  It logs
"decoder selected: <name>" once the choice is made and "toyserve: accepting
connections" when it serves.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from fleetpatch.engines.base import (EngineProfile, Evidence, Facts, LaunchConfig, Prediction, Resolution,
                                     Signature)

FILES = {"FastDecoder": "toyserve/decode/fast.py", "SlowDecoder": "toyserve/decode/slow.py",
         "TurboDecoder": "toyserve/decode/turbo.py"}
DECODERS = {"fast": "FastDecoder", "slow": "SlowDecoder", "turbo": "TurboDecoder"}
READY = "toyserve: accepting connections"
SELECTED = re.compile(r"decoder selected: (\w+)")
FATAL = Signature("FATAL", "FATAL: ", "toyserve/main.py", (), means="toyserve stopped")
KNOWN = SpecifierSet(">=2.0,<3")


class ToyProfile(EngineProfile):
    kind = "toyserve"
    package = "toyserve"
    ready_line = READY
    log_prefix = re.compile(r"^toy\[\w+ \d+\] ")          # "toy[worker 3] "
    launch_env_prefixes = ("TOYSERVE_",)
    fact_keys = ("decoder",)
    path_noun = "decoder"
    sibling_pairs = [(FILES["FastDecoder"], FILES["SlowDecoder"])]

    def knows(self, version: str) -> bool:
        try:
            return KNOWN.contains(Version(version))
        except InvalidVersion:
            return False

    def fetch_files(self, version: Optional[str]) -> List[str]:
        return ["toyserve/main.py", *FILES.values()]

    def paths_of_file(self, path: str) -> List[str]:
        p = path[2:] if path[:2] in ("a/", "b/") else path
        return [name for name, f in FILES.items() if f == p]

    def file_of_path(self, path_name: Optional[str], version: Optional[str] = None) -> Optional[str]:
        return FILES.get(path_name or "")

    def ancestors(self, path_name: Optional[str], version: Optional[str]) -> List[str]:
        return ["FastDecoder"] if path_name == "TurboDecoder" else []

    def predict(self, version: str, launch: LaunchConfig) -> Prediction:
        argv = list(launch.argv or [])
        chosen = argv[argv.index("--decoder") + 1] if "--decoder" in argv[:-1] else None
        source = "--decoder" if chosen else "TOYSERVE_DECODER"
        chosen = chosen or (launch.env or {}).get("TOYSERVE_DECODER") or "fast"

        def result(path, starts, cause, error=None):
            return Prediction(path, FILES.get(path or ""), starts, cause, error, self.knows(version), version,
                              algorithm=chosen, inputs=f"decoder {chosen}")

        if not self.knows(version):
            return result(None, True, f"toyserve {version} is not known: nothing is guessed")
        if chosen == "none":
            return result(None, True, f"{source} none: no decoder runs")
        if chosen not in DECODERS:
            return result(None, False, f"{source} {chosen} is not a decoder: toyserve would not start",
                          error=f"unknown decoder {chosen}")
        return result(DECODERS[chosen], True, f"{source} {chosen} selects {DECODERS[chosen]}")

    def find_failures(self, version: Optional[str], lines: Sequence[str]) -> List[Tuple[int, Signature]]:
        return [(i, FATAL) for i, line in enumerate(lines) if FATAL.matches(line)]

    def log_facts(self, version: Optional[str], lines: Sequence[str], first_line_no: int = 1) -> Facts:
        facts = Facts("log")
        for i, line in enumerate(lines):
            m = SELECTED.search(line)
            if m:
                facts.values["decoder"] = m.group(1)
                facts.evidence["decoder"] = Evidence("log", first_line_no + i, self.strip_prefix(line))
        return facts

    def server_info_facts(self, version: Optional[str], info: Optional[dict]) -> Optional[Facts]:
        if not isinstance(info, dict) or "decoder" not in info:
            return None
        ev = Evidence("server_info", None, f"/server_info decoder={info['decoder']}")
        return Facts("server_info", {"decoder": info["decoder"]}, {"decoder": ev})

    def launch_facts(self, prediction: Optional[Prediction], launch: Optional[LaunchConfig]) -> Optional[Facts]:
        if prediction is None or not prediction.known_version or not prediction.starts:
            return None
        ev = Evidence("launch", None, f"launch configuration: {prediction.inputs}")
        return Facts("launch", {"decoder": prediction.algorithm}, {"decoder": ev})

    def same_fact(self, key: str, a: object, b: object) -> bool:
        return str(a).lower() == str(b).lower()

    def resolve(self, version: Optional[str], values: Dict[str, object]) -> Resolution:
        if not self.knows(version or ""):
            return Resolution(None, False, f"toyserve {version} is not known")
        if "decoder" not in values:
            return Resolution(None, False, "the decoder is not known")
        name = str(values["decoder"]).lower()
        if name == "none":
            return Resolution(None, True, "no decoder")
        if name not in DECODERS:
            return Resolution(None, False, f"decoder {name} is not toyserve's")
        return Resolution(DECODERS[name], True)


PROFILE = ToyProfile()
