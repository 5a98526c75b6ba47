"""The bookstore end to end through `tierscope run`: the runner builds it from its provider,
the generator walks the shopping mix and fetches the pages' images, the tracer sees every tier.

Ground truth: the generator's own log against what the tracer saw at the web tier; the database's
own count of its orders table (read just before the runner stops the server) against the Buy
Confirm pages the generator completed."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import needs_root, needs_tcpdump
from tierscope.runner import DONE, run_experiment
from tierscope.services.postgres import Postgres
from tierscope.spec import load_spec

SPEC = Path(__file__).resolve().parent.parent / "examples" / "specs" / "tiny-bookstore.toml"

pytestmark = [
    needs_root("the lab starts PostgreSQL as its own OS user"),
    needs_tcpdump,
]


#: the tiny data set's orders when loaded: 0.9 x its 2880 x 10 customers (TPC-W clause 4.7.1)
LOADED_ORDERS = 2880 * 10 * 9 // 10


@pytest.fixture
def orders_at_stop(monkeypatch) -> dict[Path, int]:
    """The orders table's row count of each PostgreSQL server of the point, asked of the server
    itself (as its superuser, over its socket) just before the runner stops it and drops its data."""
    counts: dict[Path, int] = {}
    stop = Postgres.stop

    def counting_stop(self, *args, **kwargs):
        if self.database == "tpcw" and self.proc is not None and self.proc.poll() is None:
            counts[self.data_dir] = self.sql("select count(*) from orders", db="tpcw", admin=True)[0][0]
        return stop(self, *args, **kwargs)

    monkeypatch.setattr(Postgres, "stop", counting_stop)
    return counts


def test_the_bookstore_runs_end_to_end(tmp_path, orders_at_stop):
    spec = load_spec(SPEC)
    result = run_experiment(spec, tmp_path, report=False)
    assert result.failed == [] and len(result.done) == 1, result.failed
    d = result.dir / result.done[0]
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["status"] == DONE
    client = pq.read_table(d / "client_requests.parquet")
    requests = pq.read_table(d / "requests.parquet")
    assert client.num_rows > 20
    pages = set(client.column("state").to_pylist())
    assert "Home" in pages and len(pages) >= 5, pages
    assert pc.sum(pc.greater_equal(client["status"], 400)).as_py() == 0
    assert {"web", "app", "db"} <= set(requests.column("tier").to_pylist())
    web = requests.filter(pc.equal(requests["tier"], "web"))
    app = requests.filter(pc.equal(requests["tier"], "app"))
    # every page went through nginx to the app; the images were fetched from nginx alone
    assert app.num_rows >= client.num_rows * 0.9
    assert web.num_rows > app.num_rows, "no embedded images fetched"

    # every Buy Confirm the generator got a page for made one order (the cart is never empty there:
    # Shopping Cart refills an empty one and Buy Request comes after it), and nothing else orders;
    # a Buy Confirm without an answer (cancelled at the end of ramp-down) may or may not have
    # committed. The database's own count is read before the server stops.
    (point_db,) = [n for dir_, n in orders_at_stop.items() if d in dir_.parents]
    confirms = client.filter(pc.equal(client["state"], "BuyConfirm"))
    answered = pc.sum(pc.equal(confirms["status"], 200)).as_py() or 0
    unanswered = confirms.num_rows - answered
    made = point_db - LOADED_ORDERS
    assert answered > 0, "no Buy Confirm in the run: nothing to check the orders against"
    assert answered <= made <= answered + unanswered, (point_db, answered, unanswered)
