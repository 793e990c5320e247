"""Compare the SASS of two builds of one object, function by function. Run by
hand when a change must leave the kernels' machine code as it was (a refactor
of the CUDA sources):

    python -m lab.sass_compare BEFORE.sass AFTER.sass [--res BEFORE.res AFTER.res]
                               [--rename OLD=NEW ...]

Inputs are `cuobjdump -sass` (and `cuobjdump -res-usage`) listings. Function
names are normalized by dropping a trailing row-policy template argument
(`NS_6RmsRowE`, the default the walker refactor added; colsum's PART = 0),
so that an
RMSNorm kernel before the refactor is compared with the same kernel after
it. Instruction addresses are dropped; the kernel-parameter constant bank
offsets stay (a field inserted before others would show up), and so do the
encodings (control bits included); the padding between them is dropped. --rename
compares demangled names (c++filt) with OLD replaced by NEW, for a type
renamed on the way (--rename 'rmsnorm::WithResidualAdd<rmsnorm::RmsRow>=rmsnorm::AddRmsRow').
"""
import re
import subprocess
import sys


RENAMES = []  # (old, new) on demangled names, from --rename


def demangle(name):
    out = subprocess.run(["c++filt"], input=name, capture_output=True, text=True, check=True)
    return out.stdout.strip().replace(" ", "")


def norm_name(name):
    if RENAMES:
        name = demangle(name)
        for old, new in RENAMES:
            name = name.replace(old, new)
        return name
    name = name.replace("NS_6RmsRowE", "").replace("N7rmsnorm6RmsRowE", "")
    if "6colsum" in name:  # colsum's PART = 0 (gw), the default
        name = name.replace("ELi0EEEvNS_7BwdArgsE", "EEEvNS_7BwdArgsE")
    return name


def functions(path):
    out, cur = {}, None
    for line in open(path):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = norm_name(m.group(1))
            out[cur] = []
            continue
        if cur is None:
            continue
        # addresses dropped, and the padding cuobjdump aligns the encodings
        # with (it grows with the listing's widest address)
        line = " ".join(re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).split())
        if line:
            out[cur].append(line)
    return out


def resources(path):
    out, cur = {}, None
    for line in open(path):
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            cur = norm_name(m.group(1))
            continue
        if cur and "REG:" in line:
            # the parameter bank's size grows with appended Args fields
            out[cur] = re.sub(r"CONSTANT\[0\]:\d+", "", line).split()
    return out


def main(argv):
    while "--rename" in argv:
        i = argv.index("--rename")
        old, new = argv[i + 1].split("=", 1)
        RENAMES.append((old.replace(" ", ""), new.replace(" ", "")))
        del argv[i:i + 2]
    a, b = functions(argv[1]), functions(argv[2])
    common = sorted(set(a) & set(b))
    same = sum(a[f] == b[f] for f in common)
    print(f"sass: {len(a)} functions before, {len(b)} after, {len(common)} in both, "
          f"{same} identical")
    for f in common:
        if a[f] != b[f]:
            print("  differs:", f)
    for f in sorted(set(a) - set(b)):
        print("  only before:", f)
    if "--res" in argv:
        i = argv.index("--res")
        ra, rb = resources(argv[i + 1]), resources(argv[i + 2])
        common = sorted(set(ra) & set(rb))
        same = sum(ra[f] == rb[f] for f in common)
        print(f"res-usage (REG, STACK, SHARED, LOCAL; CONSTANT[0] aside): {len(common)} "
              f"in both, {same} identical")
        for f in common:
            if ra[f] != rb[f]:
                print("  differs:", f, ra[f], rb[f])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
