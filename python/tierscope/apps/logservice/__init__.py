"""The write-heavy log service of seed 003: clients POST log records with a token; the service
stores them in a database table directly (one INSERT per record), through an in-process queue and
batch collectors, or through a durable queue in a Redis stream.

- `store`: the three ways to store a record (`DirectStore`, `QueueStore`, `DurableStore`);
- `app`: the WSGI application (POST /log, GET /health, GET /stats) on the app server;
- `schema`: the tables (clients, logs) and the client tokens;
- `driver`: the clients: C concurrent clients each posting R records with a timeout, one outcome
  per record (its unique id, acknowledged, timed out, refused);
- `experiment`: one mode at one load on real servers, with the loss counted in the database.
"""
