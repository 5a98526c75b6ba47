"""A small Flask + psycopg2 shop, traced by the official OpenTelemetry Python SDK (a corpus system).

Run under gunicorn (`gunicorn -w W --threads T app:app`); each worker sets up its own tracer after
the fork. One endpoint, /page, does what its query string says, so each case of the corpus is a
mix of URLs (bench/diagnosis_corpus/cases.py):

  cpu=N     N units of pure-Python work in the handler (holds the GIL; a unit is ~1 ms on one core)
  q=N       N primary-key lookups
  dbcpu=N   one query that computes N md5s in SQL (CPU in the database)
  sleep=MS  one `SELECT pg_sleep(MS/1000)` (a slow query: holds a pool connection)
  hot=MS    a transaction that updates the one hot row and holds its lock for MS ms
  doc=N     N lookups of a random row of the large `docs` table (SHOP_DOCS rows; a disk read when
            the database's cache cannot hold it)

Environment: SHOP_DSN, SHOP_POOL (connections; requests wait for one), OTEL_SERVICE_NAME,
SHOP_OTLP (the receiver's /v1/traces URL), SHOP_ZIPKIN (optional: its /api/v2/spans URL, where the
same spans also go through the SDK's Zipkin JSON exporter, as a Zipkin user's app sends them).
"""

from __future__ import annotations

import atexit
import os
import random
import threading

import psycopg2
import psycopg2.pool
from flask import Flask, request
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.flask import FlaskInstrumentor
from opentelemetry.instrumentation.psycopg2 import Psycopg2Instrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "shop")}))
exporters = [OTLPSpanExporter(endpoint=os.environ["SHOP_OTLP"])]
if os.environ.get("SHOP_ZIPKIN"):
    from opentelemetry.exporter.zipkin.json import ZipkinExporter

    exporters.append(ZipkinExporter(endpoint=os.environ["SHOP_ZIPKIN"]))
for exporter in exporters:
    provider.add_span_processor(
        BatchSpanProcessor(exporter, schedule_delay_millis=200, max_export_batch_size=512, max_queue_size=65536)
    )
trace.set_tracer_provider(provider)
atexit.register(provider.shutdown)
Psycopg2Instrumentor().instrument()

app = Flask(__name__)
FlaskInstrumentor().instrument_app(app)

POOL_SIZE = int(os.environ.get("SHOP_POOL", "8"))
# every connection opened once and kept, as a real app's pool does: psycopg2's pool closes each
# connection beyond `minconn` when it is returned, so ThreadedConnectionPool(1, N) reopens one per
# request under load (untraced by the psycopg2 instrumentation, a fork and a SCRAM exchange in the db)
_pool = psycopg2.pool.ThreadedConnectionPool(POOL_SIZE, POOL_SIZE, os.environ["SHOP_DSN"])
_slots = threading.BoundedSemaphore(POOL_SIZE)  # psycopg2's pool raises when empty; real apps wait
ITEMS = int(os.environ.get("SHOP_ITEMS", "10000"))
DOCS = int(os.environ.get("SHOP_DOCS", "0"))


def burn(units: int) -> int:
    acc = 0
    for _ in range(units):
        for i in range(7_000):
            acc = (acc + i * i) % 1_000_003
    return acc


@app.route("/page")
def page():
    args = request.args
    cpu, q, dbcpu = int(args.get("cpu", 0)), int(args.get("q", 0)), int(args.get("dbcpu", 0))
    sleep, hot, doc = int(args.get("sleep", 0)), int(args.get("hot", 0)), int(args.get("doc", 0))
    out = burn(cpu) if cpu else 0
    if q or dbcpu or sleep or hot or doc:
        with _slots:
            conn = _pool.getconn()
            try:
                conn.autocommit = not hot
                with conn.cursor() as cur:
                    for _ in range(q):
                        cur.execute("SELECT id, name, price FROM items WHERE id = %s", (random.randint(1, ITEMS),))
                        out += len(cur.fetchall())
                    for _ in range(doc):
                        cur.execute("SELECT length(body) FROM docs WHERE id = %s", (random.randint(1, DOCS),))
                        out += cur.fetchone()[0]
                    if dbcpu:
                        cur.execute(
                            "SELECT count(DISTINCT left(md5(g::text), 3)) FROM generate_series(1, %s) g", (dbcpu,)
                        )
                        out += cur.fetchone()[0]
                    if sleep:
                        cur.execute("SELECT pg_sleep(%s)", (sleep / 1000.0,))
                    if hot:
                        cur.execute("UPDATE counters SET n = n + 1 WHERE id = 1")
                        cur.execute("SELECT pg_sleep(%s)", (hot / 1000.0,))
                        conn.commit()
            finally:
                _pool.putconn(conn)
    return {"ok": True, "n": out}
