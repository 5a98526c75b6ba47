"""The TPC-W bookstore on a real database (PostgreSQL; MariaDB when installed) at the tiny scale:
the population rules, every interaction called in-process as WSGI, the DigSyl searches, Buy
Confirm's order/stock arithmetic (also from 8 threads at once), Best Sellers and Admin Confirm
against our own SQL, 400s, and the static document root. One gunicorn run checks the app target.

Each DBMS is started and loaded once per module (module-scoped fixture parametrised by DBMS); the
tests run in file order and later ones see the orders earlier ones made (each computes what it
expects from the database, never from a constant that an earlier test could have changed)."""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import tempfile
import threading
import urllib.request
from dataclasses import dataclass, replace
from datetime import date, datetime
from pathlib import Path
from urllib.parse import urlencode

import pytest

from conftest import needs_root
from tierscope.apps.bookstore import datagen, static
from tierscope.apps.bookstore.app import AppConfig, create_app
from tierscope.apps.bookstore.datagen import SUBJECTS, digsyl, nurand
from tierscope.contracts.dbms import DbConfig
from tierscope.services.base import free_port
from tierscope.testbed.host import Host

HAS_MARIADB = os.path.exists("/usr/sbin/mariadbd")
needs_root = [pytest.mark.root, needs_root("database servers run as their own OS users")]
SCALE = "tiny"
ITEMS, EBS = datagen.SCALES[SCALE]
SEED = 11
NOW = datetime(2026, 3, 1, 12, 0, 0)
BOOK_LINK = re.compile(r'<p>\d+\. <a href="/tpcw/ProductDetail\?I_ID=(\d+)[^"]*">([^<]*)</a>')


@dataclass
class Rig:
    dbms: str
    server: object
    cfg: DbConfig
    app: object
    report: datagen.LoadReport

    def call(
        self, path: str, params: dict | list | None = None, method: str = "GET", headers: dict | None = None
    ) -> tuple[int, str, dict]:
        qs = urlencode(params or {}, doseq=True)
        body = qs.encode() if method == "POST" else b""
        environ = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "QUERY_STRING": "" if method == "POST" else qs,
            "CONTENT_TYPE": "application/x-www-form-urlencoded",
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body),
        }
        for k, v in (headers or {}).items():
            environ["HTTP_" + k.upper().replace("-", "_")] = v
        got = {}

        def start_response(status, hdrs):
            got["status"], got["headers"] = int(status.split()[0]), dict(hdrs)

        text = b"".join(self.app(environ, start_response)).decode()
        return got["status"], text, got["headers"]

    def ok(self, path: str, params=None, *expected: str, method: str = "GET") -> str:
        status, text, _ = self.call(path, params, method)
        assert status == 200, text[-800:]
        assert "ERROR" not in text and "Bad request" not in text
        for e in expected:
            assert e in text, f"{e!r} not in {path}"
        return text

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        if self.dbms == "postgresql":
            import psycopg

            with psycopg.connect(
                host=self.cfg.host,
                port=self.cfg.port,
                user=self.cfg.user,
                password=self.cfg.password,
                dbname=self.cfg.database,
                autocommit=True,
            ) as conn:
                cur = conn.execute(statement, params)
                return cur.fetchall() if cur.description else []
        import pymysql

        conn = pymysql.connect(
            host=self.cfg.host,
            port=self.cfg.port,
            user=self.cfg.user,
            password=self.cfg.password,
            database=self.cfg.database,
            autocommit=True,
        )
        try:
            with conn.cursor() as cur:
                cur.execute(statement, params)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def one(self, statement: str, params: tuple = ()):
        rows = self.sql(statement, params)
        return rows[0][0] if rows and len(rows[0]) == 1 else (rows[0] if rows else None)

    def count(self, table: str) -> int:
        return int(self.one(f"SELECT COUNT(*) FROM {table}"))


def _dbms_params():
    return [
        pytest.param("postgresql", marks=needs_root),
        pytest.param(
            "mariadb",
            marks=needs_root
            + [pytest.mark.skipif(not HAS_MARIADB, reason="mariadb-server not installed (/usr/sbin/mariadbd)")],
        ),
    ]


@pytest.fixture(scope="module", params=_dbms_params())
def rig(request):
    dbms = request.param
    # not under pytest's 0700 tmp directory: the servers run as the postgres / mysql users
    work = Path(tempfile.mkdtemp(prefix=f"tierscope-bookstore-test-{dbms}-"))
    request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
    host = Host.loopback()
    if dbms == "postgresql":
        from tierscope.services.postgres import Postgres

        server = Postgres(host, free_port(), work / "pg", fsync=False, database="tpcw")
    else:
        from tierscope.services.mariadb import MariaDB

        server = MariaDB(host, free_port(), work / "maria", durable=False, database="tpcw")
    cfg = server.db_config("tpcw")
    server.start()
    app = None
    try:
        report = datagen.load(cfg, SCALE, seed=SEED, now=NOW)
        app = create_app(AppConfig(db=replace(cfg, pool_size=10), items=ITEMS))
        yield Rig(dbms, server, cfg, app, report)
    finally:
        if app is not None:
            app.db.close()
        server.stop()


def book_ids(text: str) -> list[int]:
    return [int(m.group(1)) for m in BOOK_LINK.finditer(text)]


def promo_ids(text: str) -> list[int]:
    strip = re.search(r'<table class="promo">(.*?)</table>', text, re.S)
    assert strip, "no promotional strip"
    ids = [int(x) for x in re.findall(r"ProductDetail\?I_ID=(\d+)", strip.group(1))]
    assert len(re.findall(r'<img src="/tpcw/img/img\d+/thumb_\d+\.gif"', strip.group(1))) == len(ids)
    return ids


def assert_promo_is_related_of_one_item(rig: Rig, text: str) -> None:
    ids = promo_ids(text)
    assert len(ids) == 5 and len(set(ids)) == 5
    marks = ", ".join(["%s"] * 5)
    n = rig.one(
        "SELECT COUNT(*) FROM item WHERE " + " AND ".join(f"i_related{k} IN ({marks})" for k in range(1, 6)),
        tuple(ids) * 5,
    )
    assert n >= 1, f"no item has the related items {ids}"


# --- the data ----------------------------------------------------------------------------------


def test_row_counts_follow_the_population_rules(rig):
    expected = datagen.population(ITEMS, EBS)
    counts = {t: rig.count(t) for t in datagen.TABLES}
    assert counts["item"] == 1000 and counts["author"] == 250 and counts["country"] == 92
    assert counts["customer"] == 2880 * EBS and counts["address"] == 2 * 2880 * EBS
    assert counts["orders"] == 2880 * EBS * 9 // 10 == counts["cc_xacts"]
    for t in ("country", "author", "item", "customer", "address", "orders", "cc_xacts", "shopping_cart"):
        assert counts[t] == expected[t], t
    assert rig.report.rows == counts  # the report counts what is in the tables
    assert rig.report.db_size_bytes > 10_000_000 and rig.report.seconds > 0
    # 1-5 lines per order, every order has some, about 3 on average
    lo, hi, n_orders = rig.one(
        "SELECT MIN(n), MAX(n), COUNT(*) FROM (SELECT ol_o_id, COUNT(*) AS n FROM order_line GROUP BY ol_o_id) x"
    )
    assert (lo, hi, n_orders) == (1, 5, counts["orders"])
    assert 2.9 < counts["order_line"] / counts["orders"] < 3.1
    # every order's total is its sub-total + 8.25 % tax + 3.00 + 1.00 per line, and is what was charged
    bad = rig.one(
        "SELECT COUNT(*) FROM orders o JOIN cc_xacts ON cx_o_id = o_id WHERE ABS(o_total - cx_xact_amt) > 0.001 "
        "OR ABS(o_total - o_sub_total - o_tax - 3 - (SELECT COUNT(*) FROM order_line WHERE ol_o_id = o.o_id)) > 0.011"
    )
    assert bad == 0
    # order dates increase with o_id and end before the load time
    first, last = rig.one("SELECT MIN(o_date), MAX(o_date) FROM orders")
    assert (NOW - first).days in (59, 60) and last <= NOW
    assert rig.one("SELECT o_date FROM orders ORDER BY o_id DESC LIMIT 1") == last


def test_customers_authors_and_items_follow_the_digsyl_rules(rig):
    rows = rig.sql("SELECT c_id, c_uname, c_passwd FROM customer WHERE c_id IN (1, 12, 999, %s)", (2880 * EBS,))
    assert len(rows) == 4
    for c_id, uname, passwd in rows:
        assert uname == digsyl(c_id) and passwd == uname.lower()
    assert digsyl(12) == "OGAL"
    # tokens 0..items/10 name authors 1..items/10+1 in order; every last name starts with a token
    for a_id, lname in rig.sql("SELECT a_id, a_lname FROM author WHERE a_id <= 101 ORDER BY a_id"):
        assert lname.startswith(digsyl(a_id - 1, 7))
    tokens = {digsyl(k, 7) for k in range(ITEMS // 10 + 1)}
    assert all(ln[:14] in tokens for (ln,) in rig.sql("SELECT a_lname FROM author"))
    titles = {digsyl(k, 7) for k in range(ITEMS // 5 + 1)}
    assert all(t[:14] in titles for (t,) in rig.sql("SELECT i_title FROM item"))
    # first quarter of items are by the author of the same id; stock 10-30; 5 distinct related items
    assert rig.one("SELECT COUNT(*) FROM item WHERE i_id <= 250 AND i_a_id <> i_id") == 0
    assert rig.one("SELECT MIN(i_stock), MAX(i_stock) FROM item") == (10, 30)
    for row in rig.sql("SELECT i_id, i_related1, i_related2, i_related3, i_related4, i_related5 FROM item"):
        assert len(set(row)) == 6 and all(1 <= r <= ITEMS for r in row)
    assert rig.one("SELECT COUNT(DISTINCT i_subject) FROM item") == 24


def test_same_seed_gives_the_same_rows():
    a = datagen.Generator(ITEMS, 1, seed=5, now=NOW)
    b = datagen.Generator(ITEMS, 1, seed=5, now=NOW)
    c = datagen.Generator(ITEMS, 1, seed=6, now=NOW)
    assert list(a.item()) == list(b.item()) and list(a.customer())[:50] == list(b.customer())[:50]
    assert list(a.item()) != list(c.item())
    with pytest.raises(ValueError, match="items"):
        datagen.Generator(2_000, 1)


# --- the interactions --------------------------------------------------------------------------


def test_health_and_home(rig):
    assert rig.call("/tpcw/health")[0] == 200
    c_id = 17
    fname, lname = rig.one("SELECT c_fname, c_lname FROM customer WHERE c_id = %s", (c_id,))
    status, text, headers = rig.call("/tpcw/Home", {"C_ID": c_id}, headers={"X-Request-Id": "home-req-1"})
    assert status == 200 and headers["X-Request-Id"] == "home-req-1"
    assert f"Welcome back, {fname} {lname}!" in text
    assert '<img src="/tpcw/img/tpclogo.gif"' in text
    for subj in SUBJECTS:
        assert f'href="/tpcw/NewProducts?subject={subj}&C_ID={c_id}"' in text
        assert f'href="/tpcw/BestSellers?subject={subj}&C_ID={c_id}"' in text
    assert_promo_is_related_of_one_item(rig, text)
    # every dynamic link carries the session's C_ID
    links = re.findall(r'href="(/tpcw/[^"]+)"', text)
    assert len(links) >= 24 * 2 + 5 + 3 and all(f"C_ID={c_id}" in u for u in links)
    # 6 static GIFs + 5 thumbnails
    assert len(re.findall(r'<img src="/tpcw/img/', text)) == 11
    anonymous = rig.ok("/tpcw/Home", None, "Welcome to the bookstore!")
    assert "C_ID=" not in anonymous


def test_new_products_lists_the_newest_books_of_a_subject(rig):
    for subj in ("ARTS", "TRAVEL"):
        want = [
            r[0]
            for r in rig.sql(
                "SELECT i_id FROM item WHERE i_subject = %s ORDER BY i_pub_date DESC, i_title, i_id LIMIT 50", (subj,)
            )
        ]
        text = rig.ok("/tpcw/NewProducts", {"subject": subj})
        assert book_ids(text) == want and len(want) == min(
            50, rig.one("SELECT COUNT(*) FROM item WHERE i_subject = %s", (subj,))
        )
        assert_promo_is_related_of_one_item(rig, text)


def test_best_sellers_top_item_has_the_largest_quantity_in_the_last_3333_orders(rig):
    max_o = rig.one("SELECT MAX(o_id) FROM orders")
    for subj in ("ARTS", "COMPUTERS", "YOUTH"):
        sums = {
            i: int(q)
            for i, q in rig.sql(
                "SELECT ol_i_id, SUM(ol_qty) FROM order_line, item WHERE ol_i_id = i_id AND i_subject = %s "
                "AND ol_o_id > %s GROUP BY ol_i_id",
                (subj, max_o - 3333),
            )
        }
        text = rig.ok("/tpcw/BestSellers", {"subject": subj}, f"Best sellers: {subj}")
        got = book_ids(text)
        assert len(got) == min(50, len(sums)) and got
        top = max(sums.values())
        assert sums[got[0]] == top
        assert got[0] == min(i for i, q in sums.items() if q == top)  # ties: lowest i_id first
        assert [sums[i] for i in got] == sorted((sums[i] for i in got), reverse=True)
        # nothing left out that sold more than the last one listed
        assert sorted(sums.values(), reverse=True)[: len(got)] == [sums[i] for i in got]
        assert_promo_is_related_of_one_item(rig, text)


def test_product_detail_and_admin_request_show_the_book(rig):
    i_id = 321
    title, cost, image, thumb, fname, lname = rig.one(
        "SELECT i_title, i_cost, i_image, i_thumbnail, a_fname, a_lname FROM item JOIN author ON i_a_id = a_id "
        "WHERE i_id = %s",
        (i_id,),
    )
    text = rig.ok(
        "/tpcw/ProductDetail",
        {"I_ID": i_id, "C_ID": 3, "SHOPPING_ID": 9},
        title,
        f"{fname}",
        lname,
        f"Our price: {cost:.2f}",
        f'<img src="/tpcw/img/{image}"',
        f'href="/tpcw/ShoppingCart?I_ID={i_id}&ADD_FLAG=Y&C_ID=3&SHOPPING_ID=9"',
        f'href="/tpcw/AdminRequest?I_ID={i_id}&C_ID=3&SHOPPING_ID=9"',
    )
    assert image == f"img{i_id % 100}/image_{i_id}.gif"
    assert "Sorry" in rig.ok("/tpcw/ProductDetail", {"I_ID": ITEMS + 7})
    rig.ok(
        "/tpcw/AdminRequest",
        {"I_ID": i_id},
        f'<img src="/tpcw/img/{image}"',
        f'<img src="/tpcw/img/{thumb}"',
        'name="I_NEW_COST"',
        'action="/tpcw/AdminConfirm"',
    )
    assert text.count("<img ") == 6  # logo, 4 buttons, the image


def test_searches_by_emulator_digsyl_strings_hit_and_match(rig):
    rng = random.Random(3)
    a = datagen.item_a(ITEMS)
    for _ in range(12):
        token = digsyl(nurand(rng, a, 0, ITEMS // 5), 7)
        text = rig.ok("/tpcw/SearchResults", {"search_type": "title", "search_string": token})
        found = [(int(i), t) for i, t in BOOK_LINK.findall(text)]
        n = rig.one("SELECT COUNT(*) FROM item WHERE i_title LIKE %s", (token + "%",))
        assert len(found) == min(50, n) >= 1, token
        assert all(t.startswith(token) and token in t for _, t in found)
        assert [t for _, t in found] == sorted(t for _, t in found)
        assert_promo_is_related_of_one_item(rig, text)
    for _ in range(12):
        token = digsyl(nurand(rng, a, 0, ITEMS // 10), 7)
        text = rig.ok("/tpcw/SearchResults", {"search_type": "author", "search_string": token})
        got = set(book_ids(text))
        want = {
            r[0]
            for r in rig.sql("SELECT i_id FROM item JOIN author ON i_a_id = a_id WHERE a_lname LIKE %s", (token + "%",))
        }
        assert got and (got == want if len(want) <= 50 else got < want), token
    text = rig.ok("/tpcw/SearchResults", {"search_type": "subject", "search_string": "HISTORY"})
    assert len(book_ids(text)) == min(50, rig.one("SELECT COUNT(*) FROM item WHERE i_subject = 'HISTORY'"))
    assert "Sorry" in rig.ok("/tpcw/SearchResults", {"search_type": "title", "search_string": "ZZZZ"})
    # LIKE wildcards are data, not patterns
    assert "Sorry" in rig.ok("/tpcw/SearchResults", {"search_type": "title", "search_string": "%"})
    rig.ok("/tpcw/SearchRequest", {"C_ID": 4}, 'action="/tpcw/SearchResults"', 'name="search_type"')


def cart_id(text: str) -> int:
    ids = {int(x) for x in re.findall(r"SHOPPING_ID=(\d+)", text)}
    assert len(ids) == 1, ids
    return ids.pop()


def cart_qty(rig: Rig, sc_id: int) -> dict[int, int]:
    return {
        int(i): int(q)
        for i, q in rig.sql("SELECT scl_i_id, scl_qty FROM shopping_cart_line WHERE scl_sc_id = %s", (sc_id,))
    }


def test_buy_confirm_makes_one_order_and_applies_the_stock_rule(rig):
    c_id = 1234
    uname = digsyl(c_id)
    a, b, c = 101, 202, 303
    carts_before = rig.count("shopping_cart")
    sc = cart_id(rig.ok("/tpcw/ShoppingCart", {"ADD_FLAG": "Y", "I_ID": a, "C_ID": c_id}))
    assert rig.count("shopping_cart") == carts_before + 1
    rig.ok("/tpcw/ShoppingCart", {"ADD_FLAG": "Y", "I_ID": b, "C_ID": c_id, "SHOPPING_ID": sc})
    rig.ok("/tpcw/ShoppingCart", {"ADD_FLAG": "Y", "I_ID": b, "C_ID": c_id, "SHOPPING_ID": sc})
    rig.ok("/tpcw/ShoppingCart", {"ADD_FLAG": "Y", "I_ID": c, "C_ID": c_id, "SHOPPING_ID": sc})
    assert cart_qty(rig, sc) == {a: 1, b: 2, c: 1}
    # refresh: remove c, 25 of a (the stock rule then adds 21), keep b
    text = rig.ok(
        "/tpcw/ShoppingCart",
        [
            ("ADD_FLAG", "N"),
            ("C_ID", c_id),
            ("SHOPPING_ID", sc),
            ("I_ID", a),
            ("QTY", 25),
            ("I_ID", c),
            ("QTY", 0),
            ("I_ID", b),
            ("QTY", 2),
        ],
    )
    assert cart_qty(rig, sc) == {a: 25, b: 2} and f"Shopping cart {sc}: 2 lines" in text
    assert_promo_is_related_of_one_item(rig, text)
    rig.ok(
        "/tpcw/CustomerRegistration", {"C_ID": c_id, "SHOPPING_ID": sc}, f'value="{uname}"', 'action="/tpcw/BuyRequest"'
    )
    rig.ok(
        "/tpcw/BuyRequest",
        {"SHOPPING_ID": sc, "C_ID": c_id, "RETURNING_FLAG": "Y", "UNAME": uname, "PASSWD": uname.lower()},
        f"C_ID {c_id}",
        'action="/tpcw/BuyConfirm"',
    )
    login = rig.one("SELECT c_login FROM customer WHERE c_id = %s", (c_id,))
    assert abs((datetime.now() - login).total_seconds()) < 60
    stock = {i: s for i, s in rig.sql("SELECT i_id, i_stock FROM item WHERE i_id IN (%s, %s)", (a, b))}
    cost = {i: float(x) for i, x in rig.sql("SELECT i_id, i_cost FROM item WHERE i_id IN (%s, %s)", (a, b))}
    discount = float(rig.one("SELECT c_discount FROM customer WHERE c_id = %s", (c_id,)))
    before = {t: rig.count(t) for t in ("orders", "order_line", "cc_xacts", "address")}
    text = rig.ok(
        "/tpcw/BuyConfirm",
        {
            "SHOPPING_ID": sc,
            "C_ID": c_id,
            "CC_TYPE": "AMEX",
            "CC_NUMBER": "4111222233334444",
            "CC_NAME": "Test Buyer",
            "CC_EXPIRY": "2031-12-31",
            "SHIPPING": "FEDEX",
        },
        "your order has been processed",
        method="POST",
    )
    o_id = int(re.search(r"Order id: <b>(\d+)</b>", text).group(1))
    after = {t: rig.count(t) for t in before}
    assert after == {
        "orders": before["orders"] + 1,
        "order_line": before["order_line"] + 2,
        "cc_xacts": before["cc_xacts"] + 1,
        "address": before["address"],
    }
    assert o_id == rig.one("SELECT MAX(o_id) FROM orders")
    lines = {i: q for i, q in rig.sql("SELECT ol_i_id, ol_qty FROM order_line WHERE ol_o_id = %s", (o_id,))}
    assert lines == {a: 25, b: 2}
    for i, qty in lines.items():
        left = stock[i] - qty
        assert rig.one("SELECT i_stock FROM item WHERE i_id = %s", (i,)) == (left + 21 if left < 10 else left)
    assert stock[a] - 25 < 10  # the +21 branch was taken for a
    sub = (cost[a] * 25 + cost[b] * 2) * (1 - discount)
    total = sub * 1.0825 + 3 + 27
    o_c_id, o_total, o_status, bill, ship = rig.one(
        "SELECT o_c_id, o_total, o_status, o_bill_addr_id, o_ship_addr_id FROM orders WHERE o_id = %s", (o_id,)
    )
    assert o_c_id == c_id and abs(o_total - total) < 0.02 and o_status == "PENDING"
    assert bill == ship == rig.one("SELECT c_addr_id FROM customer WHERE c_id = %s", (c_id,))
    cx_amt, cx_co = rig.one("SELECT cx_xact_amt, cx_co_id FROM cc_xacts WHERE cx_o_id = %s", (o_id,))
    assert cx_amt == o_total and cx_co == rig.one("SELECT addr_co_id FROM address WHERE addr_id = %s", (ship,))
    assert cart_qty(rig, sc) == {}
    # the order is the customer's latest
    text = rig.ok(
        "/tpcw/OrderDisplay", {"UNAME": uname, "PASSWD": uname.lower()}, f"Order id: <b>{o_id}</b>", "2 order lines"
    )
    # a second confirm of the emptied cart orders nothing
    again = rig.ok(
        "/tpcw/BuyConfirm",
        {
            "SHOPPING_ID": sc,
            "C_ID": c_id,
            "CC_TYPE": "AMEX",
            "CC_NUMBER": "1",
            "CC_NAME": "x",
            "CC_EXPIRY": "2031-12-31",
            "SHIPPING": "AIR",
        },
    )
    assert "Sorry" in again and rig.count("orders") == after["orders"]


def test_new_customer_and_new_ship_address_get_sequence_ids(rig):
    max_c, max_addr = rig.one("SELECT MAX(c_id), (SELECT MAX(addr_id) FROM address) FROM customer")
    sc = cart_id(rig.ok("/tpcw/ShoppingCart", {"ADD_FLAG": "Y", "I_ID": 55}))
    fields = {
        "SHOPPING_ID": sc,
        "RETURNING_FLAG": "N",
        "FNAME": "Ada",
        "LNAME": "Lovelace",
        "STREET_1": "12 Analytical St",
        "STREET_2": "",
        "CITY": "London",
        "STATE": "LDN",
        "ZIP": "N1 9GU",
        "COUNTRY": "United Kingdom",
        "PHONE": "441234",
        "EMAIL": "ada@example.org",
        "BIRTHDATE": "1815-12-10",
        "DATA": "engine",
    }
    text = rig.ok("/tpcw/BuyRequest", fields, "Ada Lovelace", "United Kingdom")
    c_id = int(re.search(r"C_ID (\d+)\)", text).group(1))
    assert c_id > max_c and f"C_ID={c_id}&SHOPPING_ID={sc}" in text
    uname, passwd, addr = rig.one("SELECT c_uname, c_passwd, c_addr_id FROM customer WHERE c_id = %s", (c_id,))
    assert uname == digsyl(c_id) and passwd == uname.lower() and addr > max_addr
    # the same address again is found, not inserted
    n_addr = rig.count("address")
    text = rig.ok("/tpcw/BuyRequest", fields, "Ada Lovelace")
    c2 = int(re.search(r"C_ID (\d+)\)", text).group(1))
    assert c2 > c_id and rig.count("address") == n_addr
    # Buy Confirm to a new shipping address
    text = rig.ok(
        "/tpcw/BuyConfirm",
        {
            "SHOPPING_ID": sc,
            "C_ID": c_id,
            "CC_TYPE": "VISA",
            "CC_NUMBER": "42",
            "CC_NAME": "Ada",
            "CC_EXPIRY": "2030-01-31",
            "SHIPPING": "MAIL",
            "STREET_1": "1 Rue X",
            "CITY": "Paris",
            "STATE": "IDF",
            "ZIP": "75001",
            "COUNTRY": "France",
        },
    )
    o_id = int(re.search(r"Order id: <b>(\d+)</b>", text).group(1))
    ship, co = rig.one(
        "SELECT o_ship_addr_id, cx_co_id FROM orders JOIN cc_xacts ON cx_o_id = o_id WHERE o_id = %s", (o_id,)
    )
    assert ship > max_addr and ship != rig.one("SELECT c_addr_id FROM customer WHERE c_id = %s", (c_id,))
    assert co == 5  # France
    assert rig.call("/tpcw/OrderInquiry", {"C_ID": c_id})[1].count(f'value="{uname}"') == 1


def test_admin_confirm_sets_the_related_items_from_the_last_10000_orders(rig):
    max_o = rig.one("SELECT MAX(o_id) FROM orders")
    i_id = rig.one(
        "SELECT ol_i_id FROM order_line WHERE ol_o_id > %s GROUP BY ol_i_id ORDER BY COUNT(*) DESC, ol_i_id LIMIT 1",
        (max_o - 10000,),
    )
    buyers = {
        c
        for (c,) in rig.sql(
            "SELECT o_c_id FROM orders, order_line WHERE o_id = ol_o_id AND o_id > %s AND ol_i_id = %s",
            (max_o - 10000, i_id),
        )
    }
    qty: dict[int, int] = {}
    for c, item, q in rig.sql("SELECT o_c_id, ol_i_id, ol_qty FROM orders, order_line WHERE o_id = ol_o_id"):
        if c in buyers and item != i_id:
            qty[item] = qty.get(item, 0) + q
    want = sorted(qty, key=lambda k: (-qty[k], k))[:5]
    assert len(want) == 5
    text = rig.ok(
        "/tpcw/AdminConfirm",
        {
            "I_ID": i_id,
            "I_NEW_COST": "12.34",
            "I_NEW_IMAGE": "img1/image_1.gif",
            "I_NEW_THUMBNAIL": "img1/thumb_1.gif",
            "C_ID": 8,
        },
        "The book has been updated",
        "Our price: 12.34",
        '<img src="/tpcw/img/img1/image_1.gif"',
    )
    row = rig.one(
        "SELECT i_related1, i_related2, i_related3, i_related4, i_related5, i_cost, i_image, i_thumbnail, "
        "i_pub_date FROM item WHERE i_id = %s",
        (i_id,),
    )
    assert list(row[:5]) == want
    assert row[5] == 12.34 and row[6] == "img1/image_1.gif" and row[7] == "img1/thumb_1.gif"
    assert row[8] == date.today()
    for r in want:
        assert f'href="/tpcw/ProductDetail?I_ID={r}&C_ID=8"' in text
    # the updated book is now the newest of its subject
    subj = rig.one("SELECT i_subject FROM item WHERE i_id = %s", (i_id,))
    assert book_ids(rig.ok("/tpcw/NewProducts", {"subject": subj}))[0] == i_id
    assert "Sorry" in rig.ok(
        "/tpcw/AdminConfirm", {"I_ID": ITEMS + 1, "I_NEW_COST": "1", "I_NEW_IMAGE": "a.gif", "I_NEW_THUMBNAIL": "b.gif"}
    )


def test_order_display_and_refusals(rig):
    c_id = rig.one("SELECT o_c_id FROM orders WHERE o_id = 77")
    uname = digsyl(c_id)
    want = rig.one("SELECT o_id FROM orders WHERE o_c_id = %s ORDER BY o_date DESC, o_id DESC LIMIT 1", (c_id,))
    n_lines = rig.one("SELECT COUNT(*) FROM order_line WHERE ol_o_id = %s", (want,))
    rig.ok("/tpcw/OrderInquiry", {"C_ID": c_id}, f'value="{uname}"', 'action="/tpcw/OrderDisplay"')
    rig.ok(
        "/tpcw/OrderDisplay",
        {"UNAME": uname, "PASSWD": uname.lower()},
        f"Order id: <b>{want}</b>",
        f"{n_lines} order lines",
    )
    assert "Sorry" in rig.ok("/tpcw/OrderDisplay", {"UNAME": uname, "PASSWD": "wrong"})
    assert "Sorry" in rig.ok("/tpcw/OrderDisplay", {"UNAME": "NOSUCHUSER", "PASSWD": "x"})
    assert "Sorry" in rig.ok(
        "/tpcw/BuyRequest", {"SHOPPING_ID": 1, "RETURNING_FLAG": "Y", "UNAME": uname, "PASSWD": "bad"}
    )


def test_bad_parameters_answer_400_and_change_nothing(rig):
    before = {t: rig.count(t) for t in ("orders", "customer", "address", "shopping_cart", "shopping_cart_line")}
    bad = [
        ("/tpcw/ProductDetail", {"I_ID": "abc"}),
        ("/tpcw/ProductDetail", {}),
        ("/tpcw/Home", {"C_ID": "x1"}),
        ("/tpcw/NewProducts", {"subject": "COMICS"}),
        ("/tpcw/BestSellers", {}),
        ("/tpcw/SearchResults", {"search_type": "isbn", "search_string": "1"}),
        ("/tpcw/SearchResults", {"search_type": "subject", "search_string": "NOPE"}),
        ("/tpcw/SearchResults", {"search_type": "title", "search_string": "x" * 61}),
        ("/tpcw/ShoppingCart", {"ADD_FLAG": "Y", "I_ID": ITEMS + 1}),
        ("/tpcw/ShoppingCart", {"ADD_FLAG": "Y"}),
        ("/tpcw/ShoppingCart", [("ADD_FLAG", "N"), ("I_ID", 1), ("I_ID", 2), ("QTY", 1)]),
        ("/tpcw/ShoppingCart", {"ADD_FLAG": "maybe"}),
        ("/tpcw/BuyRequest", {"RETURNING_FLAG": "Y", "UNAME": "OG", "PASSWD": "og"}),
        ("/tpcw/BuyRequest", {"SHOPPING_ID": 1, "RETURNING_FLAG": "N", "FNAME": "a"}),
        (
            "/tpcw/BuyRequest",
            {
                "SHOPPING_ID": 1,
                "RETURNING_FLAG": "N",
                "FNAME": "A",
                "LNAME": "B",
                "STREET_1": "s",
                "CITY": "c",
                "STATE": "s",
                "ZIP": "1",
                "COUNTRY": "Atlantis",
                "PHONE": "1",
                "EMAIL": "e",
                "BIRTHDATE": "1970-01-01",
            },
        ),
        (
            "/tpcw/BuyConfirm",
            {
                "SHOPPING_ID": 1,
                "C_ID": 1,
                "CC_TYPE": "BITCOIN",
                "CC_NUMBER": "1",
                "CC_NAME": "n",
                "CC_EXPIRY": "2030-01-01",
                "SHIPPING": "AIR",
            },
        ),
        (
            "/tpcw/BuyConfirm",
            {
                "SHOPPING_ID": 1,
                "C_ID": 1,
                "CC_TYPE": "VISA",
                "CC_NUMBER": "12ab",
                "CC_NAME": "n",
                "CC_EXPIRY": "2030-01-01",
                "SHIPPING": "AIR",
            },
        ),
        (
            "/tpcw/BuyConfirm",
            {
                "SHOPPING_ID": 1,
                "C_ID": 1,
                "CC_TYPE": "VISA",
                "CC_NUMBER": "1",
                "CC_NAME": "n",
                "CC_EXPIRY": "2030-02-30",
                "SHIPPING": "AIR",
            },
        ),
        ("/tpcw/OrderDisplay", {"UNAME": "OG"}),
        ("/tpcw/AdminConfirm", {"I_ID": 1, "I_NEW_COST": "-1", "I_NEW_IMAGE": "a.gif", "I_NEW_THUMBNAIL": "b.gif"}),
        (
            "/tpcw/AdminConfirm",
            {"I_ID": 1, "I_NEW_COST": "1", "I_NEW_IMAGE": "../../etc/passwd", "I_NEW_THUMBNAIL": "b.gif"},
        ),
        ("/tpcw/AdminRequest", {"I_ID": "0"}),
    ]
    for path, params in bad:
        status, text, _ = rig.call(path, params)
        assert status == 400, (path, params, text[-400:])
        assert "Bad request" in text and "ERROR" not in text
    assert rig.call("/tpcw/NoSuchPage")[0] == 404
    assert rig.call("/tpcw/Home", method="DELETE")[0] == 405
    assert {t: rig.count(t) for t in before} == before


def test_concurrent_buy_confirms_get_distinct_order_ids_and_lose_no_stock_update(rig):
    common = 777
    carts = []
    for k in range(8):
        sc = cart_id(rig.ok("/tpcw/ShoppingCart", {"ADD_FLAG": "Y", "I_ID": common}))
        rig.ok("/tpcw/ShoppingCart", {"ADD_FLAG": "Y", "I_ID": 600 + k, "SHOPPING_ID": sc})
        carts.append((sc, 2000 + k))
    stock0 = rig.one("SELECT i_stock FROM item WHERE i_id = %s", (common,))
    orders0 = rig.count("orders")
    results: list = [None] * 8
    barrier = threading.Barrier(8)

    def buy(n: int) -> None:
        sc, c_id = carts[n]
        barrier.wait()
        results[n] = rig.call(
            "/tpcw/BuyConfirm",
            {
                "SHOPPING_ID": sc,
                "C_ID": c_id,
                "CC_TYPE": "VISA",
                "CC_NUMBER": "4111",
                "CC_NAME": f"buyer {n}",
                "CC_EXPIRY": "2030-06-30",
                "SHIPPING": "UPS",
            },
        )

    threads = [threading.Thread(target=buy, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ids = []
    for status, text, _ in results:
        assert status == 200, text[-600:]
        ids.append(int(re.search(r"Order id: <b>(\d+)</b>", text).group(1)))
    assert len(set(ids)) == 8 and rig.count("orders") == orders0 + 8
    assert sorted(ids) == [r[0] for r in rig.sql("SELECT o_id FROM orders ORDER BY o_id DESC LIMIT 8")][::-1]
    stock = stock0
    for _ in range(8):  # the same qty each time: the order of the buyers does not matter
        stock = stock - 1 + (21 if stock - 1 < 10 else 0)
    assert rig.one("SELECT i_stock FROM item WHERE i_id = %s", (common,)) == stock
    assert (
        rig.one(f"SELECT COUNT(*) FROM order_line WHERE ol_i_id = {common} AND ol_o_id IN ({', '.join(map(str, ids))})")
        == 8
    )


LEARN = {
    k: re.compile(rf"""(?i)(?:[?&;]{k}=|name=["']?{k}["']?\s+value=["']?)(\d+)""") for k in ("C_ID", "SHOPPING_ID")
}


def test_an_emulated_anonymous_session_with_empty_values_buys(rig):
    """The requests of the workload files (bookstore/workloads/*.toml): every parameter in every
    URL, empty while unknown; C_ID and SHOPPING_ID learnt from the pages with its regexes."""
    known = {"C_ID": "", "SHOPPING_ID": ""}

    def visit(page: str, **params) -> str:
        text = rig.ok(f"/tpcw/{page}", {**params, **known})
        for k, rx in LEARN.items():
            found = rx.findall(text)
            if found:
                known[k] = found[-1]
        return text

    visit("Home")
    assert known == {"C_ID": "", "SHOPPING_ID": ""}
    visit("ShoppingCart", ADD_FLAG="N", I_ID="")  # a new cart, with one random item
    sc = int(known["SHOPPING_ID"])
    assert len(cart_qty(rig, sc)) == 1
    visit("CustomerRegistration")
    visit(
        "BuyRequest",
        RETURNING_FLAG="N",
        UNAME="",
        PASSWD="",
        FNAME="Grace",
        LNAME="Hopper",
        STREET_1="Cobol Street 1",
        STREET_2="Second floor 22",
        CITY="Arlington Town",
        STATE="VA",
        ZIP="22201",
        COUNTRY="Bangla Desh",
        PHONE="1234567890123456",
        EMAIL="ogalri",
        BIRTHDATE="1906-12-09",
        DATA="x" * 300,
    )
    c_id = int(known["C_ID"])
    assert (
        rig.one(
            "SELECT co_name FROM customer JOIN address ON c_addr_id = addr_id JOIN country ON addr_co_id = co_id "
            "WHERE c_id = %s",
            (c_id,),
        )
        == "Bangla Desh"
    )
    long_name = "N" * 31
    text = visit(
        "BuyConfirm",
        CC_TYPE="DINERS",
        CC_NUMBER="4000123412341234",
        CC_NAME=long_name,
        CC_EXPIRY="2028-09-30",
        SHIPPING="COURIER",
        STREET_1="",
        STREET_2="",
        CITY="",
        STATE="",
        ZIP="",
        COUNTRY="",
    )
    o_id = int(re.search(r"Order id: <b>(\d+)</b>", text).group(1))
    assert rig.one("SELECT cx_name FROM cc_xacts WHERE cx_o_id = %s", (o_id,)) == long_name[:30]
    assert rig.one("SELECT o_c_id FROM orders WHERE o_id = %s", (o_id,)) == c_id
    uname = digsyl(c_id)
    visit("OrderDisplay", UNAME=uname, PASSWD=uname.lower())
    assert known == {"C_ID": str(c_id), "SHOPPING_ID": str(sc)}


def test_empty_cart_gets_a_random_related_item(rig):
    text = rig.ok("/tpcw/ShoppingCart", {"C_ID": 5})
    sc = cart_id(text)
    lines = cart_qty(rig, sc)
    assert len(lines) == 1 and list(lines.values()) == [1]
    (i,) = lines
    assert rig.one("SELECT COUNT(*) FROM item WHERE i_related1 = %s", (i,)) >= 1


# --- gunicorn and the static files ------------------------------------------------------------


@pytest.mark.parametrize("dbms", [pytest.param("postgresql", marks=needs_root)])
def test_gunicorn_serves_the_app_target(rig, dbms):
    if rig.dbms != dbms:
        pytest.skip("one gunicorn run is enough")
    from tierscope.services.appserver import AppServer

    work = Path(tempfile.mkdtemp(prefix="tierscope-bookstore-gunicorn-"))
    env = {
        "TPCW_DBMS": rig.cfg.dbms,
        "TPCW_DB_HOST": rig.cfg.host,
        "TPCW_DB_PORT": str(rig.cfg.port),
        "TPCW_DB_USER": rig.cfg.user,
        "TPCW_DB_PASSWORD": rig.cfg.password,
        "TPCW_DB_NAME": rig.cfg.database,
        "TPCW_POOL_SIZE": "4",
        "TPCW_POOL_TIMEOUT_S": "5",
        "TPCW_ITEMS": str(ITEMS),
    }
    server = AppServer(
        Host.loopback(),
        free_port(),
        work,
        app="tierscope.apps.bookstore.app:create_app()",
        app_env=env,
        health_path="/tpcw/health",
        workers=1,
        threads=2,
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        server.start()
        with opener.open(server.url + "/tpcw/ProductDetail?I_ID=42&C_ID=3", timeout=10) as r:
            text = r.read().decode()
            assert r.status == 200 and "img42/image_42.gif" in text and "C_ID=3" in text
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_static_root_has_the_gifs_and_the_image_size_classes(tmp_path):
    root = static.write_static(tmp_path / "www", items=1000)
    img = root / "tpcw" / "img"
    for name in (
        "tpclogo",
        "home_B",
        "search_B",
        "shopping_cart_B",
        "checkout_B",
        "order_status_B",
        "add_B",
        "update_B",
        "submit_B",
        "refresh_B",
        "display_last_order_B",
        "whats_new",
        "best_sellers",
    ):
        data = (img / f"{name}.gif").read_bytes()
        assert data[:6] == b"GIF89a" and data[-1:] == b";"
    sizes: dict[int, int] = {}
    for i in range(1, 1001):
        thumb = img / f"img{i % 100}" / f"thumb_{i}.gif"
        assert thumb.stat().st_size == 5 * 1024
        s = (img / f"img{i % 100}" / f"image_{i}.gif").stat().st_size
        sizes[s] = sizes.get(s, 0) + 1
    k = 1024
    assert sizes == {250 * k: 10, 100 * k: 40, 50 * k: 150, 10 * k: 350, 5 * k: 450}
    assert (img / "img7" / "image_7.gif").stat().st_nlink > 1  # hard links to one file per class
    assert not (img / "img0" / "thumb_1001.gif").exists()
    data = (img / "img0" / "image_100.gif").read_bytes()
    assert data[:6] == b"GIF89a" and data[-1:] == b";" and len(data) == 250 * k
    assert static.write_static(tmp_path / "www", items=1000) == root  # again: nothing to do
