"""The testbed: hosts (network namespaces + cgroups) on one bridge, resource monitor, interference.

`Testbed(lab).up(point)` builds a host per server; see lab.py. Modules: host (where a server
runs), network (bridge, namespaces, veths), cgroups (v1 limits), monitor (the resources table),
interference (pauses, noisy neighbour), clean (remove everything tierscope left).
"""

from tierscope.testbed.host import Host

__all__ = ["Host", "Testbed", "TestbedError"]


def __getattr__(name: str):
    if name in ("Testbed", "TestbedError"):
        # late: lab imports pydantic (tierscope.spec); the monitor and burner processes start without it
        from tierscope.testbed import lab

        return getattr(lab, name)
    raise AttributeError(name)
