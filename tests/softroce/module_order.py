"""module_order.py MODDIR NAME...: prints the .ko paths (relative to MODDIR) that must be
insmod-ed, dependencies first, to load the named modules (from MODDIR/modules.dep)."""
import os
import sys


def load_order(moddir, names):
    deps = {}
    with open(os.path.join(moddir, "modules.dep")) as f:
        for line in f:
            path, _, rest = line.partition(":")
            deps[path] = rest.split()
    by_name = {os.path.basename(p).split(".ko")[0].replace("-", "_"): p for p in deps}
    order, seen = [], set()

    def visit(path, depth=0):
        if path in seen or depth > 64:  # modules.dep is acyclic; the bound guards bad input
            return
        for dep in reversed(deps[path]):  # listed users-first: load from the far end
            visit(dep, depth + 1)
        seen.add(path)
        order.append(path)

    for name in names:
        if name not in by_name:
            sys.exit(f"module {name} is not in {moddir}")
        visit(by_name[name])
    return order


if __name__ == "__main__":
    print("\n".join(load_order(sys.argv[1], sys.argv[2:])))
