// A small Express + pg shop (a system of tierscope's diagnosis corpus, bench/diagnosis).
// One endpoint, /page, does what its query string says (see flask_shop/app.py for the same in Python):
//   cpu=N units of JavaScript work on the event loop (~1 ms each), q=N primary-key lookups,
//   dbcpu=N one query computing N md5s in SQL, sleep=MS one pg_sleep, hot=MS a transaction that
//   updates the one hot row and holds its lock for MS ms, doc=N lookups of a random row of the
//   large `docs` table (SHOP_DOCS rows: a disk read when the database's cache cannot hold it).
// Environment: SHOP_DSN, SHOP_POOL (pg.Pool max), SHOP_PORT, SHOP_OTLP, OTEL_SERVICE_NAME.
'use strict';
const express = require('express');
const { Pool } = require('pg');

const pool = new Pool({ connectionString: process.env.SHOP_DSN, max: Number(process.env.SHOP_POOL || 8) });
const ITEMS = Number(process.env.SHOP_ITEMS || 10000);
const DOCS = Number(process.env.SHOP_DOCS || 0);
const app = express();

function burn(units) {
  let acc = 0;
  for (let u = 0; u < units; u++) {
    for (let i = 0; i < 100000; i++) acc = (acc + i * i) % 1000003;
  }
  return acc;
}

app.get('/page', async (req, res) => {
  const a = req.query;
  const cpu = Number(a.cpu || 0), q = Number(a.q || 0), dbcpu = Number(a.dbcpu || 0);
  const sleep = Number(a.sleep || 0), hot = Number(a.hot || 0), doc = Number(a.doc || 0);
  try {
    let out = cpu ? burn(cpu) : 0;
    if (q || dbcpu || sleep || hot || doc) {
      const client = await pool.connect();
      try {
        for (let i = 0; i < q; i++) {
          const id = 1 + Math.floor(Math.random() * ITEMS);
          const r = await client.query('SELECT id, name, price FROM items WHERE id = $1', [id]);
          out += r.rows.length;
        }
        for (let i = 0; i < doc; i++) {
          const id = 1 + Math.floor(Math.random() * DOCS);
          const r = await client.query('SELECT length(body) AS n FROM docs WHERE id = $1', [id]);
          out += Number(r.rows[0].n);
        }
        if (dbcpu) {
          const r = await client.query(
            'SELECT count(DISTINCT left(md5(g::text), 3)) AS n FROM generate_series(1, $1) g', [dbcpu]);
          out += Number(r.rows[0].n);
        }
        if (sleep) await client.query('SELECT pg_sleep($1)', [sleep / 1000]);
        if (hot) {
          await client.query('BEGIN');
          await client.query('UPDATE counters SET n = n + 1 WHERE id = 1');
          await client.query('SELECT pg_sleep($1)', [hot / 1000]);
          await client.query('COMMIT');
        }
      } finally {
        client.release();
      }
    }
    res.json({ ok: true, n: out });
  } catch (err) {
    res.status(500).json({ ok: false, error: String(err) });
  }
});

const server = app.listen(Number(process.env.SHOP_PORT), '127.0.0.1');
server.keepAliveTimeout = 65000;

async function stop() {
  server.close();
  try {
    await global.__shopTracerProvider.forceFlush();
    await global.__shopTracerProvider.shutdown();
  } finally {
    await pool.end().catch(() => {});
    process.exit(0);
  }
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
