"""Docker images for container hosts, built without a registry.

* The base image: Debian 13 (trixie) with its ``python3`` (3.13), from a root made by
  ``debootstrap --variant=minbase --include=python3 trixie`` and imported with
  ``docker import``.  The root is cached at /var/cache/fleetpatch-test/trixie-root
  (FLEETPATCH_TRIXIE_ROOT), shared with the probe tests: built once, in a temporary
  directory renamed into place, under the same lock file.
* The engine image, per SGLang version: SGLang laid out as the official
  ``lmsysorg/sglang`` image has it.  The real wheel's files under
  ``/sgl-workspace/sglang/python/sglang``, installed editable into Debian's
  ``/usr/local/lib/python3.X/dist-packages`` (no venv) the way ``pip install -e python``
  of SGLang's setuptools pyproject does it: ``__editable__.sglang-X.pth`` importing a
  finder module ``__editable___sglang_X_finder`` that maps ``sglang`` to the checkout,
  and ``sglang-X.dist-info`` (the wheel's METADATA, ``direct_url.json`` with
  ``"editable": true``, INSTALLER, RECORD).  The stand-in server is
  ``dist-packages/sglang_standin/`` (with ``fleetpatch_standin_common/``), as on a plain demo host; it imports the worker
  from /sgl-workspace.  No CMD, as in the official image: the container's command is
  ``python3 -m sglang_standin ...`` (where an operator writes ``python3 -m
  sglang.launch_server ...``).

* The vLLM engine image, per vLLM release: vLLM laid out as the official
  ``vllm/vllm-openai`` image has it (docker/Dockerfile of vllm-project/vllm: the
  final stage installs the wheel with ``uv pip install --system dist/*.whl`` into the
  system Python, so the package is ``/usr/local/lib/python3.12/dist-packages/vllm``,
  the path that Dockerfile's own test stage copies ``vllm/v1`` to; ``WORKDIR
  /vllm-workspace``; ``ENV VLLM_USAGE_SOURCE production-docker-image``;
  ``ENTRYPOINT ["vllm", "serve"]``, the model and flags being the container's command).
  Here: the release's real files (vllm_hosts.vllm_tree) and its dist-info in
  ``/usr/local/lib/python3.13/dist-packages`` (the official image's Python is
  deadsnakes' 3.12 on Ubuntu 22.04, ours Debian trixie's 3.13: the same system
  dist-packages of the same layout, only the version in the path differs), the
  stand-in beside it as ``vllm_standin/``, and ``ENTRYPOINT ["python3", "-m",
  "vllm_standin", "serve"]`` in place of ``["vllm", "serve"]`` (the ``vllm`` script
  would import the real vLLM, which needs torch and a GPU), so the container's
  command is the same ``MODEL --speculative-config ... --port P`` as with the
  official image.  Its log is the container's output, as vLLM's is there.

All are cached by a content tag: the tag names a hash of every input, so an image
is rebuilt only when an input changes.
"""
from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .dockerd import Dockerd, DockerError, docker_unavailable
from . import vllm_hosts
from .standinsite import install_sglang_standin
from .wheels import sglang_tree

TRIXIE_ROOT_ENV = "FLEETPATCH_TRIXIE_ROOT"
DEFAULT_TRIXIE_ROOT = "/var/cache/fleetpatch-test/trixie-root"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBOOTSTRAP_ARGS = ("--variant=minbase", "--include=python3", "trixie")
# what never goes into the image: scratch files other users of the root leave, apt's downloads
TAR_EXCLUDES = ("./tmp/*", "./proc/*", "./sys/*", "./dev/*", "./run/*",
                "./var/cache/apt/archives/*.deb", "./var/cache/apt/*.bin")
BASE_REPO = "fleetpatch-demo/trixie-python3"
ENGINE_REPO = "fleetpatch-demo/sglang"
VLLM_REPO = "fleetpatch-demo/vllm"
VLLM_RECIPE = "1"   # bump when the vLLM layout below changes
VLLM_WORKDIR = "/vllm-workspace"
# The official image's entrypoint is ["vllm", "serve"]: ours runs the stand-in the same way.
VLLM_ENTRYPOINT = ["python3", "-m", vllm_hosts.STANDIN_MODULE, "serve"]
VLLM_IMAGE_ENV = {"VLLM_USAGE_SOURCE": "production-docker-image"}
IMAGE_RECIPE = "2"   # bump when the layout below changes
SGL_CHECKOUT = "/sgl-workspace/sglang/python"
IMAGE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


class ImageError(RuntimeError):
    """An image could not be built."""


def trixie_root() -> Path:
    """The shared Debian trixie root with python3, debootstrapped once (30 s - 2 min)."""
    root = Path(os.environ.get(TRIXIE_ROOT_ENV) or DEFAULT_TRIXIE_ROOT)
    if (root / "usr/bin/python3").exists():
        return root
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        raise ImageError(f"no Debian trixie root at {root}, and building one needs root and "
                         f"debootstrap (apt-get install debootstrap)")
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / ".trixie.lock", "w") as lock:   # the probe tests' lock too
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "usr/bin/python3").exists():
            build = Path(tempfile.mkdtemp(prefix=root.name + ".build-", dir=root.parent))
            done = subprocess.run(["debootstrap", *DEBOOTSTRAP_ARGS, str(build), DEBIAN_MIRROR],
                                  capture_output=True, text=True)
            if done.returncode != 0 or not (build / "usr/bin/python3").exists():
                shutil.rmtree(build, ignore_errors=True)
                tail = (done.stderr.strip() or done.stdout.strip())[-300:]
                raise ImageError(f"debootstrap of trixie failed (exit {done.returncode}): {tail}")
            build.rename(root)
    return root


def containers_unavailable(sock: str | None = None) -> str | None:
    """What ``fleetpatch demo --containers`` lacks here, in one plain line, or None: a reachable
    Docker daemon (docker_unavailable) and a way to the base image (the cached trixie root,
    or root and debootstrap to make it)."""
    reason = docker_unavailable(sock)
    if reason:
        return reason
    root = Path(os.environ.get(TRIXIE_ROOT_ENV) or DEFAULT_TRIXIE_ROOT)
    if not (root / "usr/bin/python3").exists():
        if os.geteuid() != 0:
            return f"no Debian trixie root at {root} for the engine image, and making one needs root"
        if not shutil.which("debootstrap"):
            return (f"no Debian trixie root at {root} for the engine image: install debootstrap "
                    f"(apt-get install debootstrap)")
    return None


def _python_version(root: Path) -> str:
    """'3.13' for the root's /usr/bin/python3."""
    target = os.readlink(root / "usr/bin/python3")   # python3 -> python3.13
    return Path(target).name.removeprefix("python")


def _hash12(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:12]


def base_image(docker: Dockerd) -> str:
    """The base image's tag, imported from the trixie root unless that tag exists already.
    The tag hashes the debootstrap recipe, the tar excludes and the root's dpkg status
    (which packages, which versions): another root is another tag."""
    root = trixie_root()
    status = (root / "var/lib/dpkg/status").read_bytes()
    tag = f"{BASE_REPO}:{_hash12(' '.join(DEBOOTSTRAP_ARGS).encode(), ' '.join(TAR_EXCLUDES).encode(), status)}"
    if docker.inspect_image(tag) is not None:
        return tag
    with _image_lock(docker):
        if docker.inspect_image(tag) is not None:
            return tag
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "--xattrs",
                                *(f"--exclude={x}" for x in TAR_EXCLUDES), "-cf", "-", "."],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        changes = [f"ENV {k}={v}" for k, v in IMAGE_ENV.items()]
        imp = subprocess.run(docker.cli_argv("import", *(a for c in changes for a in ("--change", c)),
                                             "-", tag),
                             stdin=tar.stdout, capture_output=True, text=True)
        tar.stdout.close()
        tar_err = tar.stderr.read().decode(errors="replace")
        tar.wait()
        if tar.returncode != 0 or imp.returncode != 0:
            raise ImageError(f"docker import of {root} failed: {(imp.stderr or tar_err).strip()[-400:]}")
    return tag


def engine_image(docker: Dockerd, version: str) -> str:
    """The engine image's tag for SGLang `version`, built unless it exists already."""
    return _image(docker, ENGINE_REPO, IMAGE_RECIPE, version,
                  lambda rootfs, pyver: _lay_out(rootfs, sglang_tree(version), version, pyver), _sglang_dockerfile)


def vllm_image(docker: Dockerd, version: str) -> str:
    """The vLLM engine image's tag for vLLM `version`, built unless it exists already."""
    return _image(docker, VLLM_REPO, VLLM_RECIPE, version,
                  lambda rootfs, pyver: _lay_out_vllm(rootfs, vllm_hosts.vllm_tree(version), version, pyver),
                  _vllm_dockerfile)


def _image(docker: Dockerd, repo: str, recipe: str, version: str, lay_out, dockerfile) -> str:
    """An engine image's tag, built on the base image unless it exists already: what the engine
    adds is `lay_out(rootfs, python version)`, its Dockerfile `dockerfile(base tag, version)`; the
    tag is `repo`:`version`-<hash of `recipe`, the base and every file of the build context>."""
    base = base_image(docker)
    pyver = _python_version(trixie_root())
    with tempfile.TemporaryDirectory(prefix=f"fleetpatch-{repo.rsplit('/', 1)[-1]}-") as tmp:
        context = Path(tmp)
        lay_out(context / "rootfs", pyver)
        (context / "Dockerfile").write_text(dockerfile(base, version))
        tag = f"{repo}:{version}-{_hash12(recipe.encode(), base.encode(), _tree_digest(context))}"
        if docker.inspect_image(tag) is not None:
            return tag
        with _image_lock(docker):
            if docker.inspect_image(tag) is None:
                try:
                    docker.cli("build", "--network", "host", "-q", "-t", tag, str(context), timeout=600)
                except DockerError as e:
                    raise ImageError(f"building {tag}: {e}") from e
    return tag


def container_package_dir(engine: str) -> str:
    """Where an engine image holds the engine package: SGLang's editable checkout, or vLLM's
    system dist-packages (with the base image's Python version)."""
    if engine == "vllm":
        return vllm_site(_python_version(trixie_root())) + "/vllm"
    return f"{SGL_CHECKOUT}/sglang"


def vllm_site(pyver: str) -> str:
    """Where the vLLM image's Python finds vllm: the system dist-packages, as in vllm/vllm-openai."""
    return f"/usr/local/lib/python{pyver}/dist-packages"


def _lay_out_vllm(rootfs: Path, tree: Path, version: str, pyver: str) -> None:
    """The files the vLLM engine image adds to the base image, under `rootfs`: what
    ``uv pip install --system`` of the wheel leaves (the package, its dist-info with uv's
    INSTALLER and a RECORD), the stand-in, the demo model's config and the workdir."""
    site = rootfs / vllm_site(pyver).lstrip("/")
    shutil.copytree(tree / "vllm", site / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    dist = f"vllm-{version}.dist-info"
    (site / dist).mkdir(parents=True)
    shutil.copyfile(next(tree.glob("vllm-*.dist-info")) / "METADATA", site / dist / "METADATA")
    (site / dist / "INSTALLER").write_text("uv\n")
    (site / dist / "REQUESTED").write_text("")
    files = sorted(p for p in (site / "vllm").rglob("*") if p.is_file()) + [site / dist / n for n in
                                                                         ("METADATA", "INSTALLER", "REQUESTED")]
    _write_record(site / dist, {str(path.relative_to(site)): path.read_bytes() for path in files})
    vllm_hosts.install_standin(site)
    vllm_hosts.model_files(rootfs)
    (rootfs / VLLM_WORKDIR.lstrip("/")).mkdir(parents=True)
    _readable_by_all(rootfs)


def _vllm_dockerfile(base: str, version: str) -> str:
    return "\n".join([
        f"FROM {base}",
        "COPY rootfs/ /",
        f"WORKDIR {VLLM_WORKDIR}",
        *(f"ENV {k}={v}" for k, v in VLLM_IMAGE_ENV.items()),
        f"ENTRYPOINT {json.dumps(VLLM_ENTRYPOINT)}",
        f'LABEL fleetpatch.demo.vllm="{version}"',
        "",
    ])


def _sglang_dockerfile(base: str, version: str) -> str:
    return "\n".join([
        f"FROM {base}",
        "COPY rootfs/ /",
        "WORKDIR /sgl-workspace/sglang",   # the checkout, as SGLang's Dockerfiles leave it: not its parent, where the
        # checkout directory `sglang` would shadow the package as a namespace package
        f'LABEL {"fleetpatch.demo.sglang"}="{version}"',
        "",
    ])


def _lay_out(rootfs: Path, tree: Path, version: str, pyver: str) -> None:
    """The files the engine image adds to the base image, under `rootfs`."""
    checkout = rootfs / SGL_CHECKOUT.lstrip("/")
    shutil.copytree(tree / "sglang", checkout / "sglang",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (checkout / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools>=61.0", "wheel"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "sglang"\nversion = "{version}"\n')
    (rootfs / "models" / "demo").mkdir(parents=True)
    site = rootfs / "usr/local/lib" / f"python{pyver}" / "dist-packages"
    site.mkdir(parents=True)
    finder_mod = f"__editable___sglang_{version.replace('.', '_').replace('-', '_')}_finder"
    files = {
        f"__editable__.sglang-{version}.pth": f"import {finder_mod}; {finder_mod}.install()\n",
        f"{finder_mod}.py": FINDER_TEMPLATE.replace("@MAPPING@", repr({"sglang": f"{SGL_CHECKOUT}/sglang"})),
    }
    dist = f"sglang-{version}.dist-info"
    wheel_dist = next(tree.glob("sglang-*.dist-info"))
    files[f"{dist}/METADATA"] = (wheel_dist / "METADATA").read_text()
    files[f"{dist}/INSTALLER"] = "pip\n"
    files[f"{dist}/REQUESTED"] = ""
    files[f"{dist}/top_level.txt"] = "sglang\n"
    files[f"{dist}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: setuptools (80.9.0)\n"
                              "Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{dist}/direct_url.json"] = json.dumps({"dir_info": {"editable": True},
                                                   "url": f"file://{SGL_CHECKOUT}"})
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(text.encode())
    _write_record(site / dist, {rel: text.encode() for rel, text in files.items()})
    install_sglang_standin(site)
    _readable_by_all(rootfs)


def _write_record(dist_info: Path, files: dict) -> None:
    """`dist_info`/RECORD as an installer writes it: a line per installed file {path relative to
    the site dir: bytes}, with its sha256 and size, and the RECORD's own line last."""
    record = io.StringIO()
    for rel, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{rel},sha256={digest},{len(data)}\n")
    record.write(f"{dist_info.name}/RECORD,,\n")
    (dist_info / "RECORD").write_text(record.getvalue())


def _readable_by_all(rootfs: Path) -> None:
    """Every directory under `rootfs` 0755 and every file 0644, as an image's files are."""
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)


def _tree_digest(context: Path) -> bytes:
    """Paths, modes and bytes of every file under `context`."""
    h = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(context)).encode() + b"\0" + oct(path.stat().st_mode).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.digest()


class _image_lock:
    """One image build at a time per daemon root (several test processes share a daemon)."""

    def __init__(self, docker: Dockerd):
        # not next to the socket: container hosts see that directory
        self.path = Path(tempfile.gettempdir()) / f"fleetpatch-images-{_hash12(docker.sock.encode())}.lock"

    def __enter__(self):
        self.f = open(self.path, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.f.close()


def build_times(docker: Dockerd, version: str) -> dict:
    """{'base_s', 'engine_s'}: seconds each step took now (a cached image takes ~0)."""
    t = time.monotonic()
    base_image(docker)
    t1 = time.monotonic()
    engine_image(docker, version)
    return {"base_s": round(t1 - t, 2), "engine_s": round(time.monotonic() - t1, 2)}


# The editable finder, as setuptools' editable_wheel writes it for a flat layout with
# packages.find (SGLang's python/pyproject.toml): a meta path finder for the top-level
# package, appended to sys.meta_path by the .pth file.
FINDER_TEMPLATE = '''\
import sys
from importlib.machinery import PathFinder
from importlib.util import spec_from_file_location
from pathlib import Path

MAPPING = @MAPPING@
NAMESPACES = {}


class _EditableFinder:  # MetaPathFinder
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in MAPPING:
            init = Path(MAPPING[fullname], "__init__.py")
            if init.exists():
                return spec_from_file_location(fullname, init,
                                               submodule_search_locations=[MAPPING[fullname]])
            return None
        parent, _, _child = fullname.rpartition(".")
        if parent and parent in MAPPING:
            return PathFinder.find_spec(fullname, path=[MAPPING[parent]])
        return None


def install():
    if not any(finder == _EditableFinder for finder in sys.meta_path):
        sys.meta_path.append(_EditableFinder)
'''
