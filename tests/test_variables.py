"""The MLX_RMSNORM_* variables: one rule for all of them (documented on and
off spellings, any case, surrounding spaces ignored; anything else a
one-line error naming the variable and the values it takes, which stops
the program), tested the way users meet them: a program that never imports
mlx_rmsnorm, started with the variable, the .pth installed beside the
package processed at interpreter start.

The .pth's own test of the variables (which decides whether it imports the
package) is checked against the package's rules, and its way of telling
the package that it runs inside site is checked in every supported
interpreter found here, with a stand-in package that needs no MLX (the
extension exists for one interpreter only)."""

import builtins
import glob
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import build_backend as _backend

from mlx_rmsnorm import _autopatch

ROOT = Path(__file__).resolve().parent.parent
VARIABLES = ("MLX_RMSNORM_PATCH", "MLX_RMSNORM_ROUTE_CPU", "MLX_RMSNORM_REPORT", "MLX_RMSNORM_FUSE_MIN_ROWS",
             "MLX_RMSNORM_ALLOCATOR")


def _installed_pth():
    """The .pth of this environment (./run.sh writes it; a regular install
    puts it there), or None."""
    b = _backend()
    for d in sys.path:
        path = os.path.join(d, b.PTH_NAME)
        if os.path.isfile(path):
            return path
    return None


@pytest.fixture(scope="module")
def pth():
    path = _installed_pth()
    if path is None:
        pytest.skip("no mlx_rmsnorm_autopatch.pth in this environment (./run.sh writes it)")
    # the one the backend writes today, not a stale copy
    assert Path(path).read_text() == _backend().PTH_LINE, f"{path} is stale: run ./run.sh"
    return path


def _start(env_extra, code="import sys; print('ran', 'mlx_rmsnorm' in sys.modules)"):
    """A program that never imports mlx_rmsnorm, started with the variables
    (and none of the suite's own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RMSNORM_")}
    env.update(env_extra)
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=ROOT / "tests", timeout=300)


# --- bad values: one line, the program never runs -----------------------------------

BAD = [
    ("MLX_RMSNORM_PATCH", "yes"), ("MLX_RMSNORM_PATCH", "true"), ("MLX_RMSNORM_PATCH", "bogus"),
    ("MLX_RMSNORM_PATCH", "2"),
    ("MLX_RMSNORM_ROUTE_CPU", "garbage"), ("MLX_RMSNORM_ROUTE_CPU", "enable"), ("MLX_RMSNORM_ROUTE_CPU", "2"),
    ("MLX_RMSNORM_REPORT", "garbage"), ("MLX_RMSNORM_REPORT", "y"),
    ("MLX_RMSNORM_FUSE_MIN_ROWS", "\u00b3"), ("MLX_RMSNORM_FUSE_MIN_ROWS", "\u0661"),
    ("MLX_RMSNORM_FUSE_MIN_ROWS", "-1"), ("MLX_RMSNORM_FUSE_MIN_ROWS", "1.5"),
    ("MLX_RMSNORM_FUSE_MIN_ROWS", "many"),
    ("MLX_RMSNORM_ALLOCATOR", "torch"), ("MLX_RMSNORM_ALLOCATOR", "1"), ("MLX_RMSNORM_ALLOCATOR", "off"),
]
ACCEPTED = {  # what the message names
    "MLX_RMSNORM_PATCH": ["1 (patch())", "fuse (patch(fuse=True))", "0, false, no, off"],
    "MLX_RMSNORM_ROUTE_CPU": ["1, true, yes, on", "0, false, no, off"],
    "MLX_RMSNORM_REPORT": ["1, true, yes, on", "0, false, no, off"],
    "MLX_RMSNORM_FUSE_MIN_ROWS": ["an integer >= 0"],
    "MLX_RMSNORM_ALLOCATOR": ["pool", "mlx"],
}


@pytest.mark.parametrize("name,value", BAD, ids=[f"{n[12:]}={v!r}" for n, v in BAD])
def test_a_bad_value_stops_the_program_with_one_line(pth, name, value):
    r = _start({name: value}, "print('ran')")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "ran" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"mlx_rmsnorm: {name}={value!r} ")
    for accepted in ACCEPTED[name]:
        assert accepted in lines[0], lines[0]


def test_a_bad_value_beside_good_ones_patches_nothing(pth):
    r = _start({"MLX_RMSNORM_PATCH": "1", "MLX_RMSNORM_REPORT": "oui"}, "print('ran')")
    assert r.returncode == 2 and "ran" not in r.stdout
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "MLX_RMSNORM_REPORT='oui'" in r.stderr


@pytest.mark.parametrize("name,value", [("MLX_RMSNORM_PATCH", "yes"), ("MLX_RMSNORM_ROUTE_CPU", "garbage"),
                                        ("MLX_RMSNORM_FUSE_MIN_ROWS", "\u00b3")])
def test_a_bad_value_at_import_is_a_value_error(name, value):
    # set in a running program (the .pth saw nothing at start): the import raises, naming it
    r = _start({}, f"import os; os.environ[{name!r}] = {value!r}; import mlx_rmsnorm; print('ran')")
    assert r.returncode == 1 and "ran" not in r.stdout
    assert r.stderr.strip().splitlines()[-1].startswith(f"ValueError: mlx_rmsnorm: {name}={value!r} ")


# --- on and off spellings -----------------------------------------------------------

STATE = ("import sys; m = sys.modules.get('mlx_rmsnorm'); "
         "from mlx_rmsnorm import _fuse, _patching; "  # after the check: imports it where absent
         "rows = _fuse.min_rows(); "
         "print('imported', m is not None, 'patched', m is not None and m.is_patched(), "
         "'fused', m is not None and m.is_fused(), 'route_cpu', _patching.routes_cpu(), 'rows', rows)")


def _state(env):
    r = _start(env, STATE)
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    return dict(zip(words[::2], words[1::2])), r.stderr


@pytest.mark.parametrize("value,patched,fused", [
    ("1", True, False), (" 1 ", True, False), ("fuse", True, True), ("FUSE", True, True),
    ("", False, False), ("0", False, False), (" 0", False, False), ("false", False, False),
    ("No", False, False), ("OFF ", False, False),
])
def test_patch_spellings(pth, value, patched, fused):
    state, _ = _state({"MLX_RMSNORM_PATCH": value})
    assert state["imported"] == str(patched)  # off: the .pth does not import the package
    assert state["patched"] == str(patched) and state["fused"] == str(fused)


@pytest.mark.parametrize("value,on", [
    ("1", True), ("true", True), ("YES", True), (" on ", True),
    ("", False), ("0", False), (" 0", False), ("false", False), ("no", False), ("Off", False),
])
def test_route_cpu_spellings(pth, value, on):
    state, _ = _state({"MLX_RMSNORM_PATCH": "1", "MLX_RMSNORM_ROUTE_CPU": value})
    assert state["patched"] == "True" and state["route_cpu"] == str(on)


@pytest.mark.parametrize("value,on", [
    ("1", True), ("True", True), ("yes", True), ("ON", True),
    ("", False), ("0", False), (" 0", False), ("false", False), ("no", False), ("off", False),
])
def test_report_spellings(pth, value, on):
    state, err = _state({"MLX_RMSNORM_REPORT": value})
    assert state["imported"] == str(on) and state["patched"] == "False"
    assert ("mlx_rmsnorm report:" in err) == on, err


@pytest.mark.parametrize("value,rows", [(" 128 ", "128"), ("0", "0"), ("007", "7")])
def test_min_rows_spellings(pth, value, rows):
    state, _ = _state({"MLX_RMSNORM_FUSE_MIN_ROWS": value})
    assert state["imported"] == "False"  # a row count alone needs no import at start
    assert state["rows"] == rows


@pytest.mark.parametrize("value,allocator", [("", "pool"), ("pool", "pool"), (" Pool ", "pool"),
                                             ("mlx", "mlx"), (" MLX ", "mlx")])
def test_allocator_spellings(pth, monkeypatch, value, allocator):
    state, _ = _state({"MLX_RMSNORM_ALLOCATOR": value})
    assert state["imported"] == "False"  # read by the extension when it allocates
    monkeypatch.setenv("MLX_RMSNORM_ALLOCATOR", value)
    assert _autopatch.read_environment()["MLX_RMSNORM_ALLOCATOR"] == allocator


# --- the .pth's test agrees with the package's rules --------------------------------

SPELLINGS = ["", " ", "0", " 0", "1", " 1 ", "true", "TRUE", "yes", "on", "false", "No", "off", "fuse",
             "Fuse", "garbage", "2", "-1", "64", " 128 ", "\u00b3", "\u0661", "1.5", "mlx", " MLX ", "pool"]


def _pth_imports(line, env):
    """Whether the .pth line imports mlx_rmsnorm in a process with `env`:
    the line run with an import that records instead of importing."""
    imported = []
    fake_sys = types.SimpleNamespace(modules={})
    fake_os = types.SimpleNamespace(environ=env)

    def fake_import(name, *a, **k):
        if name == "mlx_rmsnorm":
            imported.append(getattr(fake_sys, _autopatch.FROM_PTH, False))
            return None
        return {"os": fake_os, "sys": fake_sys}[name]

    exec(line, {"__builtins__": {**vars(builtins), "__import__": fake_import}})
    assert imported in ([], [True])  # and it says it runs from the .pth
    return bool(imported)


@pytest.mark.parametrize("name", VARIABLES)
def test_the_pth_imports_exactly_where_the_package_has_work(monkeypatch, name):
    line = _backend().PTH_LINE
    for value in SPELLINGS:
        for v in VARIABLES:
            monkeypatch.delenv(v, raising=False)
        monkeypatch.setenv(name, value)
        try:
            found = _autopatch.read_environment()
            work = found["patch"] is not None or found["MLX_RMSNORM_REPORT"]
        except ValueError:
            work = True  # a bad value: the package stops the program
        assert _pth_imports(line, dict(os.environ)) == work, (name, value)


# --- every supported interpreter: the .pth tells the package where it runs ----------


def _interpreters():
    """Python >= 3.10 interpreters on this machine (pyenv's or on PATH)."""
    found = {}
    for minor in range(10, 15):
        v = f"3.{minor}"
        candidates = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{v}.*/bin/python{v}")))
        candidates += [p for p in [shutil.which(f"python{v}")] if p]
        for exe in candidates:
            try:
                ok = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                                    text=True, timeout=60).stdout.strip() == f"(3, {minor})"
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if ok:
                found[v] = exe
                break
    return found


INTERPRETERS = _interpreters()
STAND_IN = """\
import sys
print("stand-in imported, from the .pth:", getattr(sys, "_mlx_rmsnorm_from_pth", False), file=sys.stderr)
from mlx_rmsnorm._autopatch import FROM_PTH, read_environment
read_environment()  # the package's rules, which need no MLX
if hasattr(sys, FROM_PTH):
    delattr(sys, FROM_PTH)
"""


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13", "3.14"])
def test_the_pth_stops_a_program_with_one_line_in_every_interpreter(tmp_path, version):
    exe = INTERPRETERS.get(version)
    if exe is None:
        pytest.skip(f"no Python {version} here")
    # a user site (PYTHONUSERBASE) with the .pth and a stand-in package: the
    # real _autopatch.py under an __init__ that needs no MLX
    site = tmp_path / "base" / "lib" / f"python{version}" / "site-packages"
    (site / "mlx_rmsnorm").mkdir(parents=True)
    (site / _backend().PTH_NAME).write_text(_backend().PTH_LINE)
    (site / "mlx_rmsnorm" / "__init__.py").write_text(STAND_IN)
    shutil.copy(ROOT / "mlx_rmsnorm" / "_autopatch.py", site / "mlx_rmsnorm" / "_autopatch.py")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLX_RMSNORM_", "PYTHON")) and k != "VIRTUAL_ENV"}
    env["PYTHONUSERBASE"] = str(tmp_path / "base")

    def start(extra):
        return subprocess.run([exe, "-c", "print('ran')"], capture_output=True, text=True,
                              env={**env, **extra}, cwd=tmp_path, timeout=120)

    r = start({})
    assert r.returncode == 0 and r.stdout == "ran\n" and r.stderr == "", r.stderr  # nothing set: no import
    r = start({"MLX_RMSNORM_PATCH": "1"})
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
    assert r.stderr == "stand-in imported, from the .pth: True\n"  # the site is the user site: it ran
    for name, value in [("MLX_RMSNORM_PATCH", "yes"), ("MLX_RMSNORM_ROUTE_CPU", "off!"),
                        ("MLX_RMSNORM_REPORT", " maybe"), ("MLX_RMSNORM_FUSE_MIN_ROWS", "\u00b3")]:
        r = start({name: value})
        lines = r.stderr.splitlines()
        assert r.returncode == 2 and r.stdout == "", (version, name, r.stdout, r.stderr)
        assert lines[0].startswith("stand-in imported") and len(lines) == 2, r.stderr
        assert lines[1].startswith(f"mlx_rmsnorm: {name}={value!r} "), r.stderr
