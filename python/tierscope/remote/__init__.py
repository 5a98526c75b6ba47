"""Real hosts: run a spec's points on machines reached over SSH, deployed with Ansible.

`tierscope run SPEC --hosts inventory.yml` does, per point, what the local runner does with
namespaced hosts, but each server runs on a host of the inventory (docs/remote.md):

- `inventory`  reads and checks the Ansible inventory (groups web/app/middleware/db/client) and
  assigns the spec's servers to its hosts;
- `clock`      measures each host's clock offset over SSH and refuses a run above a bound;
- `playbooks`  writes the playbooks (into the run directory, readable and rerunnable) and runs
  `ansible-playbook`;
- `agent`      the remote side (`python -m tierscope.remote.agent`): starts one server with the
  services layer, its capture and its monitor, keeps them until told to stop, runs the generator;
- `run`        the sweep over the points: up, load, down, fetch, then the same tables, trace,
  manifest and report as a local run.

The local runner (`tierscope.runner`) knows nothing of this package; this package reuses the
runner's stage functions (tracing, collecting, the manifest, the report).
"""


class RemoteError(RuntimeError):
    """The remote run cannot go on: a bad inventory, an unreachable host, a clock too far off."""
