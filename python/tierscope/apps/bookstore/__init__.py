"""The TPC-W-like online bookstore (seed 004's system), the second application next to RUBBoS.

- `app`: the WSGI application, the 14 web interactions under /tpcw/ with the Wisconsin servlets'
  SQL shapes through the shared dal (gunicorn: `tierscope.apps.bookstore.app:create_app()`,
  configured by TPCW_* environment variables);
- `pages`: the HTML helpers (header with the TPC logo and buttons, promotional strip, links that
  carry C_ID and SHOPPING_ID);
- `schema_postgres.sql`, `schema_mariadb.sql`: the 10 tables and their secondary indexes (ids from
  sequences / AUTO_INCREMENT);
- `datagen`: the deterministic data generator and bulk loader (`generate`, `load`, `SCALES`) and
  what an emulator shares with it (`digsyl`, `nurand`, `item_a`, `customer_a`, `SUBJECTS`,
  `COUNTRIES`, `CARD_TYPES`, `SHIP_TYPES`);
- `static`: the document root nginx serves (static GIFs, per-item thumbnails and images).

See the research note phase2-workloads §1 for the benchmark itself.
"""
