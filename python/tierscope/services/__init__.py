"""One module per real server program: how to configure, start, check and stop it.

- `nginx.Nginx`        the web tier (static pages, reverse proxy to app servers, access log)
- `postgres.Postgres`  PostgreSQL 15 (Debian binaries), own data directory and port
- `mariadb.MariaDB`    MariaDB (Debian), own data directory, port and socket
- `appserver`          the Python application server (gunicorn) running an app such as RUBBoS

All share `base.Service`: `start()` (write config, start inside a Host, wait healthy), `stop()`,
`pids()`, `logs()`, and context-manager use.
"""

from tierscope.services.base import Service, ServiceError

__all__ = ["Service", "ServiceError"]
