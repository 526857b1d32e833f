"""Container paths resolved inside the container's root (agent/inroot.py), on a tmp dir
laid out as a hostile image: absolute symlinks to the host's /etc, `..` chains, loops, a
symlinked parent directory. No host file outside the root is read or written."""
from __future__ import annotations

import os

import pytest
from hypothesis import given, settings, HealthCheck
from hypothesis import strategies as st

from fleetpatch.agent import files, inroot
from fleetpatch.agent.base import AgentError


@pytest.fixture
def image(tmp_path):
    """A container root beside a host file it must never reach."""
    host_secret = tmp_path / "host-etc" / "shadow"
    host_secret.parent.mkdir()
    host_secret.write_bytes(b"the host's secret\n")
    root = tmp_path / "root"
    for d in ("etc", "usr/lib/python3/site-packages/sglang", "opt", "var/tmp"):
        (root / d).mkdir(parents=True)
    (root / "etc" / "shadow").write_bytes(b"the container's own\n")
    (root / "usr/lib/python3/site-packages/sglang/__init__.py").write_bytes(b"# sglang\n")
    return root, host_secret


def test_an_absolute_symlink_resolves_against_the_containers_root(image):
    root, secret = image
    (root / "opt" / "leak").symlink_to(secret)                # the host's file, by its host path
    (root / "opt" / "etc").symlink_to("/etc")                 # the image's /etc, not the host's
    assert inroot.host_path(str(root), "/opt/etc/shadow") == str(root / "etc" / "shadow")
    assert inroot.read(str(root), "/opt/etc/shadow") == b"the container's own\n"
    with pytest.raises(FileNotFoundError):                  # inside the container that path does not exist
        inroot.read(str(root), "/opt/leak")
    assert inroot.host_path(str(root), "/opt/leak").startswith(str(root) + "/")


def test_dot_dot_never_climbs_above_the_root(image):
    root, secret = image
    rel = "../" * 12 + str(secret).lstrip("/")
    (root / "opt" / "up").symlink_to(rel)                   # relative, climbing out of the root
    assert inroot.host_path(str(root), "/../../../etc/shadow") == str(root / "etc" / "shadow")
    assert inroot.host_path(str(root), "/opt/up").startswith(str(root) + "/")
    with pytest.raises(FileNotFoundError):
        inroot.read(str(root), "/opt/up")
    assert inroot.read(str(root), "/usr/../../../../etc/shadow") == b"the container's own\n"


def test_a_symlink_loop_is_refused_naming_the_path(image):
    root, _ = image
    (root / "opt" / "a").symlink_to("b")
    (root / "opt" / "b").symlink_to("/opt/a")
    with pytest.raises(AgentError, match=r"container path /opt/a/x .*loop"):
        inroot.host_path(str(root), "/opt/a/x")


def test_a_symlinked_parent_directory_is_followed_inside_the_root(image, tmp_path):
    root, secret = image
    (root / "usr" / "local").symlink_to("/usr/lib")         # the image's own layout: followed, inside
    assert inroot.host_path(str(root), "/usr/local/python3/site-packages") == \
        str(root / "usr/lib/python3/site-packages")
    assert inroot.glob(str(root), "/usr/local/python3*/site-packages") == ["/usr/lib/python3/site-packages"]
    (root / "var" / "lib").symlink_to(secret.parent)        # to the host's folder, by its host path
    assert inroot.glob(str(root), "/var/lib/*") == []
    with pytest.raises(AgentError, match="/usr/local in the container is a symlink"):
        inroot.host_path(str(root), "/usr/local/python3", refuse_links=True)


def test_a_package_file_that_links_out_is_not_read_and_a_write_through_a_link_is_refused(image):
    root, secret = image
    pkg = root / "usr/lib/python3/site-packages"
    (pkg / "sglang" / "srt").symlink_to(secret.parent)      # the package's folder, to the host's /etc
    jail = str(root)
    assert files.describe_file(str(pkg), "sglang/srt/shadow", True, jail) is None
    with pytest.raises(AgentError, match="is a symlink"):
        files.write_all_or_nothing(str(pkg), [{"path": "sglang/srt/shadow", "op": "modify", "data": b"pwned\n",
                                               "original": b"the host's secret\n"}])
    assert secret.read_bytes() == b"the host's secret\n"


def test_a_pycache_that_is_a_symlink_is_not_emptied(tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    (host / "mod.cpython-311.pyc").write_bytes(b"host's")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_bytes(b"x = 1\n")
    (pkg / "__pycache__").symlink_to(host)
    assert files.remove_bytecode(str(pkg / "mod.py")) == []
    assert (host / "mod.cpython-311.pyc").read_bytes() == b"host's"


NAMES = st.sampled_from(["a", "b", "etc", "..", ".", "opt"])
TARGETS = st.lists(NAMES, min_size=0, max_size=5).flatmap(
    lambda ps: st.sampled_from(["/", "", "../../"]).map(lambda lead: lead + "/".join(ps)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(links=st.lists(st.tuples(st.sampled_from(["a", "b", "opt/a", "opt/b", "etc/a"]), TARGETS), max_size=4),
       path=st.lists(NAMES, min_size=1, max_size=6))
def test_whatever_the_links_the_path_stays_inside_the_root(tmp_path_factory, links, path):
    base = tmp_path_factory.mktemp("img")
    root = base / "root"
    (root / "opt").mkdir(parents=True)
    (root / "etc").mkdir()
    for name, target in links:
        p = root / name
        if not os.path.lexists(p):
            p.symlink_to(target or ".")
    try:
        got = inroot.host_path(str(root), "/" + "/".join(path))
    except AgentError as e:
        assert "loop" in e.message
        return
    assert got == str(root) or got.startswith(str(root) + "/")
    assert os.path.realpath(got).startswith(str(root.resolve())), got   # no link left on it leads out


def test_a_probe_records_folder_that_links_out_is_not_opened_up(tmp_path):
    from fleetpatch.probe import install as probe_install
    host_dir = tmp_path / "host-etc"
    host_dir.mkdir(mode=0o755)
    host_dir.chmod(0o755)
    site, probe_dir = tmp_path / "site", tmp_path / "var-tmp" / "fleetpatch-probe"
    site.mkdir()
    probe_dir.mkdir(parents=True)
    (probe_dir / "records").symlink_to(host_dir)            # left in the image, or by the server's side
    with pytest.raises(probe_install.ProbeInstallError, match="records is a symlink"):
        probe_install.install(str(site), str(probe_dir), "a" * 16, {"modules": []})
    assert host_dir.stat().st_mode & 0o7777 == 0o755
    assert not list(site.iterdir()), "no .pth: nothing half-done"
