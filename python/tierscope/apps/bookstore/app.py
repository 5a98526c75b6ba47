"""The TPC-W bookstore as a WSGI application: the 14 web interactions of the research note
(phase2-workloads §1.3) with the Wisconsin servlets' SQL shapes, parameterised, through the shared
data-access layer (`tierscope.apps.dal`).

URLs (all under /tpcw/; GET or POST with a url-encoded form; session state in the URL as `C_ID`
and `SHOPPING_ID`, which every link and form of a page carries when known):

| interaction | path | parameters |
|---|---|---|
| Home | /tpcw/Home | [C_ID] |
| New Products | /tpcw/NewProducts | subject |
| Best Sellers | /tpcw/BestSellers | subject |
| Product Detail | /tpcw/ProductDetail | I_ID |
| Search Request | /tpcw/SearchRequest | |
| Search Results | /tpcw/SearchResults | search_type (author, title, subject), search_string |
| Shopping Cart | /tpcw/ShoppingCart | [SHOPPING_ID] (a new cart when absent or unknown), ADD_FLAG=Y and I_ID (add), or ADD_FLAG=N with pairs I_ID=..&QTY=.. (refresh; QTY 0 removes; an empty cart gets a random item's i_related1) |
| Customer Registration | /tpcw/CustomerRegistration | [C_ID], SHOPPING_ID |
| Buy Request | /tpcw/BuyRequest | SHOPPING_ID, RETURNING_FLAG=Y with UNAME, PASSWD, or RETURNING_FLAG=N with FNAME, LNAME, STREET_1, STREET_2, CITY, STATE, ZIP, COUNTRY (a co_name), PHONE, EMAIL, BIRTHDATE (YYYY-MM-DD), DATA |
| Buy Confirm | /tpcw/BuyConfirm | SHOPPING_ID, C_ID, CC_TYPE, CC_NUMBER (digits), CC_NAME (cut to 30 characters), CC_EXPIRY (YYYY-MM-DD), SHIPPING, [STREET_1, STREET_2, CITY, STATE, ZIP, COUNTRY: a new shipping address] |
| Order Inquiry | /tpcw/OrderInquiry | [C_ID] |
| Order Display | /tpcw/OrderDisplay | UNAME, PASSWD |
| Admin Request | /tpcw/AdminRequest | I_ID |
| Admin Confirm | /tpcw/AdminConfirm | I_ID, I_NEW_COST, I_NEW_IMAGE, I_NEW_THUMBNAIL |

Plus /tpcw/health (200 when the database answers). Images are `<img src="/tpcw/img/...">`: the
static GIFs and the items' thumbnails and images, which nginx serves (see `static.py`), never the
app. Home, New Products, Best Sellers, Search Request, Search Results and Shopping Cart show the
promotional strip (5 thumbnails of a random item's related items, linking to Product Detail).

Conventions (as RUBBoS): pages that find nothing or refuse (unknown user, wrong password, empty
cart) contain "Sorry" and answer 200; malformed or missing parameters answer 400 ("Bad request:
..."); failures answer 500 with a page containing "ERROR" (the trace goes to the log); the
request id comes from `X-Request-Id` (or is made here), is sent back, and is appended to every SQL
statement by the dal.

Transactions: the dal runs in autocommit; `transaction()` below runs START TRANSACTION / COMMIT
(ROLLBACK on any error, retried on a deadlock or lock timeout) on the request's own connection.
Shopping Cart, Buy Request for a new customer, Buy Confirm and Admin Confirm each run in one
transaction. Buy Confirm locks the cart row first (a double submit makes one order) and the
items' rows in i_id order (SELECT ... FOR UPDATE; concurrent orders queue on them, not deadlock) before
the stock rule: new stock = stock - qty, plus 21 when that is below 10.

Departures from the Wisconsin servlets (quirks not copied): ids come from sequences /
AUTO_INCREMENT (INSERT ... RETURNING on PostgreSQL, LAST_INSERT_ID on MariaDB), never
max()+1 / count()+1 under a JVM lock; a new customer's c_uname = DigSyl(c_id) is set right after
the insert in the same transaction; o_tax holds the tax amount (not the rate), o_status 'PENDING'
as the loaded rows; Order Display shows the customer's latest order (ORDER BY o_date DESC, o_id
DESC; the original sorted o_date ascending); result lists have a tie-breaker (i_id) so equal
sums/titles come in a stable order; Admin Confirm pads fewer than 5 related items with the next
distinct item ids (the original could repeat ids or name the item itself).

Configuration: `create_app()` reads TPCW_* environment variables (see `AppConfig.from_env`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import string
import time
from dataclasses import dataclass
from datetime import date, timedelta

from tierscope.apps import web
from tierscope.apps.bookstore import pages
from tierscope.apps.bookstore.datagen import CARD_TYPES, SHIP_TYPES, SUBJECTS, TAX_RATE, digsyl
from tierscope.apps.bookstore.pages import money, url
from tierscope.apps.dal import Database, DatabaseError, like_prefix
from tierscope.apps.web import BadRequest, FormRequest, db_config_from_env, esc, fmt_date, now, sorry
from tierscope.contracts.dbms import DbConfig

log = logging.getLogger("tierscope.bookstore")

PREFIX = pages.PREFIX
MAX_CART_LINES = 100
IMAGE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,39}$")
SEARCH_TYPES = ("author", "title", "subject")


@dataclass(frozen=True)
class AppConfig:
    db: DbConfig
    items: int = 0  # 0: ask the database (MAX(i_id)) once

    @classmethod
    def from_env(cls, env=os.environ) -> AppConfig:
        """TPCW_DBMS (postgresql|mariadb), TPCW_DB_HOST, TPCW_DB_PORT, TPCW_DB_USER,
        TPCW_DB_PASSWORD, TPCW_DB_NAME (default tpcw), TPCW_POOL_SIZE, TPCW_POOL_TIMEOUT_S,
        TPCW_ITEMS (the loaded item count, for random picks; 0 or unset: asked of the database)."""
        try:
            db = db_config_from_env(env, "TPCW", "tpcw")
            items = int(env.get("TPCW_ITEMS", "0") or 0)
            if items < 0:
                raise ValueError(f"TPCW_ITEMS: expected >= 0, got {items}")
            return cls(db=db, items=items)
        except ValueError as err:
            raise SystemExit(f"bookstore app: bad TPCW_* setting: {err}") from err


# --- request handling ------------------------------------------------------------------------


class Request(FormRequest):
    def __init__(self, environ: dict, request_id: str, app: BookstoreApp):
        super().__init__(environ, request_id)
        self.app = app
        self.buttons: list | None = None
        self.c_id = self.int("C_ID", lo=1, required=False)
        self.shopping_id = self.int("SHOPPING_ID", lo=1, required=False)

    # parameters

    def choice(self, name: str, options) -> str:
        value = self.text(name, 60)
        if value not in options:
            raise BadRequest(f"parameter {name}: expected one of {', '.join(options)}, got {value[:40]!r}")
        return value

    def date(self, name: str) -> date:
        value = self.text(name, 10)
        try:
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
                raise ValueError
            return date.fromisoformat(value)
        except ValueError:
            raise BadRequest(f"parameter {name}: expected a date YYYY-MM-DD, got {value[:40]!r}") from None

    def number(self, name: str, lo: float, hi: float) -> float:
        value = self.text(name, 20)
        if not re.fullmatch(r"\d{1,9}(\.\d{1,2})?", value):
            raise BadRequest(f"parameter {name}: expected a decimal number, got {value[:40]!r}")
        x = float(value)
        if not lo <= x <= hi:
            raise BadRequest(f"parameter {name}: {x} is outside [{lo}, {hi}]")
        return x

    def image_name(self, name: str) -> str:
        value = self.text(name, 40)
        if not IMAGE_NAME_RE.fullmatch(value) or ".." in value:
            raise BadRequest(f"parameter {name}: expected an image path like img5/image_105.gif")
        return value

    def address(self, required: bool) -> dict | None:
        """The address fields (STREET_1 ... COUNTRY); None when not required and STREET_1 is empty."""
        if not required and not self.params.get("STREET_1"):
            return None
        return {
            "street1": self.text("STREET_1", 40),
            "street2": self.text("STREET_2", 40, required=False),
            "city": self.text("CITY", 30),
            "state": self.text("STATE", 20),
            "zip": self.text("ZIP", 10),
            "country": self.text("COUNTRY", 50),
        }

    # links carrying the session state

    def link(self, script: str, **params) -> str:
        return url(script, **params, C_ID=self.c_id, SHOPPING_ID=self.shopping_id)

    def session_fields(self) -> str:
        return pages.hidden(C_ID=self.c_id, SHOPPING_ID=self.shopping_id)


# --- database helpers ------------------------------------------------------------------------

TRANSIENT = ("deadlock", "lock wait timeout", "could not serialize", "(1213", "(1205")


def transaction(s, work, attempts: int = 3):
    """Run `work()` between START TRANSACTION and COMMIT on the session's connection; ROLLBACK
    on any error (and run it again, up to `attempts` times, after a deadlock or lock timeout)."""
    for attempt in range(1, attempts + 1):
        s.execute("START TRANSACTION")
        try:
            result = work()
        except BaseException as err:
            with contextlib.suppress(Exception):  # the connection is gone: the pool discards it
                s.execute("ROLLBACK")
            if isinstance(err, DatabaseError) and attempt < attempts and any(t in str(err).lower() for t in TRANSIENT):
                log.warning("transaction retried after: %s", err)
                time.sleep(0.005 * attempt)
                continue
            raise
        s.execute("COMMIT")
        return result
    raise AssertionError("unreachable")


def insert_id(s, sql: str, params: tuple, column: str) -> int:
    """Run an INSERT of one row; return the id the sequence / AUTO_INCREMENT gave it."""
    if s.db.dbms == "postgresql":
        return int(s.one(f"{sql} RETURNING {column}", params)[column])
    return s.insert(sql, params)  # MariaDB: cursor.lastrowid


def cart_lines(s, sc_id: int) -> list[dict]:
    return s.query(
        "SELECT scl_i_id, scl_qty, i_title, i_cost, i_srp, i_backing, i_thumbnail "
        "FROM shopping_cart_line JOIN item ON scl_i_id = i_id WHERE scl_sc_id = %s ORDER BY scl_i_id",
        (sc_id,),
    )


def totals(lines: list[dict], discount: float) -> dict[str, float]:
    """The cart's sub-total (after the customer's discount), tax, shipping (3.00 + 1.00 per book)
    and total, as the original Cart computes them."""
    sub = sum(float(ln["i_cost"]) * int(ln["scl_qty"]) for ln in lines) * (1 - discount)
    tax = sub * TAX_RATE
    ship = 3.00 + 1.00 * sum(int(ln["scl_qty"]) for ln in lines)
    return {"sub": round(sub, 2), "tax": round(tax, 2), "ship": round(ship, 2), "total": round(sub + tax + ship, 2)}


def enter_address(s, a: dict) -> int:
    """The id of an address equal to `a` (looked up, or inserted)."""
    co = s.one("SELECT co_id FROM country WHERE co_name = %s", (a["country"],))
    if co is None:
        raise BadRequest(f"parameter COUNTRY: unknown country {a['country'][:50]!r}")
    fields = (a["street1"], a["street2"], a["city"], a["state"], a["zip"], co["co_id"])
    row = s.one(
        "SELECT addr_id FROM address WHERE addr_street1 = %s AND addr_street2 = %s AND addr_city = %s "
        "AND addr_state = %s AND addr_zip = %s AND addr_co_id = %s",
        fields,
    )
    if row:
        return int(row["addr_id"])
    return insert_id(
        s,
        "INSERT INTO address (addr_street1, addr_street2, addr_city, addr_state, addr_zip, addr_co_id) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        fields,
        "addr_id",
    )


def promo(req: Request, s) -> str:
    """The promotional strip: the related items of a random item."""
    i = req.app.random_item(s)
    rows = s.query(
        "SELECT j.i_id, j.i_thumbnail FROM item i, item j WHERE i.i_id = %s AND "
        "j.i_id IN (i.i_related1, i.i_related2, i.i_related3, i.i_related4, i.i_related5) ORDER BY j.i_id",
        (i,),
    )
    return pages.promo_strip(rows, req.link)


def book_list(req: Request, rows: list[dict]) -> str:
    return "".join(
        f'<p>{n}. <a href="{req.link("ProductDetail", I_ID=r["i_id"])}">{esc(r["i_title"])}</a> '
        f"by {esc(r['a_fname'])} {esc(r['a_lname'])}</p>\n"
        for n, r in enumerate(rows, start=1)
    )


def subject(req: Request) -> str:
    return req.choice("subject", SUBJECTS)


def cart_table(lines: list[dict], editable: bool = False) -> str:
    head = '<table border="1"><tr><th>Qty</th><th>Title</th><th>Backing</th><th>SRP</th><th>Our price</th></tr>\n'
    rows = []
    for ln in lines:
        qty = (
            f'<input type="hidden" name="I_ID" value="{ln["scl_i_id"]}">'
            f'<input type="text" name="QTY" size="3" value="{ln["scl_qty"]}">'
            if editable
            else f"{ln['scl_qty']}"
        )
        rows.append(
            f"<tr><td>{qty}</td><td>{esc(ln['i_title'])} (I_ID {ln['scl_i_id']})</td><td>{esc(ln['i_backing'])}</td>"
            f"<td>{money(ln['i_srp'])}</td><td>{money(ln['i_cost'])}</td></tr>\n"
        )
    return head + "".join(rows) + "</table>\n"


def totals_html(t: dict[str, float]) -> str:
    return (
        f"<p>Subtotal with discount: {money(t['sub'])}<br>Tax: {money(t['tax'])}<br>"
        f"Shipping &amp; handling: {money(t['ship'])}<br><b>Total: {money(t['total'])}</b></p>\n"
    )


def random_text(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choices(string.ascii_letters, k=rng.randint(lo, hi)))


# --- the interactions --------------------------------------------------------------------------
# Each takes (request, session) and returns (title, body html); HTTP 200.


def home(req, s):
    greeting = "Welcome to the bookstore!"
    if req.c_id is not None:
        row = s.one("SELECT c_fname, c_lname FROM customer WHERE c_id = %s", (req.c_id,))
        if row:
            greeting = f"Welcome back, {row['c_fname']} {row['c_lname']}!"
    subjects = "".join(
        f'<tr><td><a href="{req.link("NewProducts", subject=x)}">{esc(x)}</a></td>'
        f'<td><a href="{req.link("BestSellers", subject=x)}">{esc(x)}</a></td></tr>\n'
        for x in SUBJECTS
    )
    return "Home", (
        f"<p>{esc(greeting)}</p>\n"
        + promo(req, s)
        + f"<table><tr><td>{pages.gif('whats_new', 'What is new')}</td><td>{pages.gif('best_sellers', 'Best sellers')}</td></tr>\n"
        + subjects
        + "</table>\n"
    )


def new_products(req, s):
    subj = subject(req)
    rows = s.query(
        "SELECT i_id, i_title, a_fname, a_lname FROM item JOIN author ON i_a_id = a_id "
        "WHERE i_subject = %s ORDER BY i_pub_date DESC, i_title, i_id LIMIT 50",
        (subj,),
    )
    title = f"New products: {subj}"
    body = promo(req, s)
    if not rows:
        return title, body + f"<p>Sorry, there is no book in {esc(subj)}.</p>\n"
    return title, body + book_list(req, rows)


def best_sellers(req, s):
    subj = subject(req)
    rows = s.query(
        "SELECT i_id, i_title, a_fname, a_lname FROM item, author, order_line "
        "WHERE i_id = ol_i_id AND i_a_id = a_id AND ol_o_id > (SELECT MAX(o_id) - 3333 FROM orders) "
        "AND i_subject = %s GROUP BY i_id, i_title, a_fname, a_lname ORDER BY SUM(ol_qty) DESC, i_id LIMIT 50",
        (subj,),
    )
    title = f"Best sellers: {subj}"
    body = promo(req, s)
    if not rows:
        return title, body + f"<p>Sorry, no book in {esc(subj)} sold lately.</p>\n"
    return title, body + book_list(req, rows)


def book_details(req, b: dict) -> str:
    saving = float(b["i_srp"] or 0) - float(b["i_cost"] or 0)
    return (
        f"<p><b>{esc(b['i_title'])}</b> by {esc(b['a_fname'])} {esc(b['a_mname'])} {esc(b['a_lname'])}</p>\n"
        f"<p>{pages.img(b['i_image'], b['i_title'])}</p>\n"
        f"<p>{esc(b['i_desc'])}</p>\n"
        f"<p>Subject: {esc(b['i_subject'])}<br>Publisher: {esc(b['i_publisher'])}<br>"
        f"Published: {esc(b['i_pub_date'])}<br>Available: {esc(b['i_avail'])}<br>"
        f"ISBN: {esc(b['i_isbn'])}<br>Pages: {esc(b['i_page'])}<br>Backing: {esc(b['i_backing'])}<br>"
        f"Dimensions: {esc(b['i_dimensions'])}<br>In stock: {esc(b['i_stock'])}</p>\n"
        f"<p>Suggested retail: {money(b['i_srp'])}<br><b>Our price: {money(b['i_cost'])}</b><br>"
        f"You save: {money(saving)}</p>\n"
    )


def get_book(s, i_id: int) -> dict | None:
    return s.one("SELECT * FROM item JOIN author ON i_a_id = a_id WHERE i_id = %s", (i_id,))


def product_detail(req, s):
    i_id = req.int("I_ID", lo=1)
    b = get_book(s, i_id)
    if b is None:
        return sorry("Product detail", f"there is no book with I_ID {i_id}.")
    req.buttons = [
        ("ShoppingCart", "add_B", "Add to cart", {"I_ID": i_id, "ADD_FLAG": "Y"}),
        ("SearchRequest", "search_B", "Search", {}),
        ("Home", "home_B", "Home", {}),
        ("AdminRequest", "update_B", "Update", {"I_ID": i_id}),
    ]
    return "Product detail", book_details(req, b)


def search_form(req) -> str:
    opts = "".join(f'<option value="{t}">{t.capitalize()}</option>' for t in SEARCH_TYPES)
    subjects = ", ".join(esc(x) for x in SUBJECTS)
    return (
        f'<form action="{PREFIX}/SearchResults" method="get">\n'
        f'<p>Search by <select name="search_type">{opts}</select> '
        '<input type="text" name="search_string" size="30" maxlength="60"> '
        f'{req.session_fields()}<input type="image" src="{pages.IMG}/submit_B.gif" alt="Search"></p>\n'
        f"</form>\n<p><small>Subjects: {subjects}</small></p>\n"
    )


def search_request(req, s):
    return "Search request", promo(req, s) + search_form(req)


def search_results(req, s):
    kind = req.choice("search_type", SEARCH_TYPES)
    word = req.text("search_string", 60)
    if kind == "author":
        rows = s.query(
            "SELECT i_id, i_title, a_fname, a_lname FROM author, item WHERE a_lname LIKE %s AND i_a_id = a_id "
            "ORDER BY i_title, i_id LIMIT 50",
            (like_prefix(word),),
        )
    elif kind == "title":
        rows = s.query(
            "SELECT i_id, i_title, a_fname, a_lname FROM item, author WHERE i_title LIKE %s AND i_a_id = a_id "
            "ORDER BY i_title, i_id LIMIT 50",
            (like_prefix(word),),
        )
    else:
        if word not in SUBJECTS:
            raise BadRequest(f"parameter search_string: expected a subject ({', '.join(SUBJECTS)}), got {word[:40]!r}")
        rows = s.query(
            "SELECT i_id, i_title, a_fname, a_lname FROM item, author WHERE i_subject = %s AND i_a_id = a_id "
            "ORDER BY i_title, i_id LIMIT 50",
            (word,),
        )
    title = f"Search results: {kind} {word}"
    body = promo(req, s)
    if not rows:
        body += f"<p>Sorry, no book matches {esc(kind)} {esc(word)}.</p>\n"
    else:
        body += f"<p>{len(rows)} books found.</p>\n" + book_list(req, rows)
    return title, body + search_form(req)


def shopping_cart(req, s):
    add = (req.params.get("ADD_FLAG") or "N").upper()
    if add not in ("Y", "N"):
        raise BadRequest(f"parameter ADD_FLAG: expected Y or N, got {add[:10]!r}")
    n_items = req.app.item_count(s)
    add_id = req.int("I_ID", lo=1, hi=n_items) if add == "Y" else None
    changes: list[tuple[int, int]] = []
    if add == "N":  # empty values are "not given": ADD_FLAG=N&I_ID= only shows the cart
        ids = [v for v in req.multi.get("I_ID", []) if v != ""]
        qtys = [v for v in req.multi.get("QTY", []) if v != ""]
        if qtys and len(ids) != len(qtys):
            raise BadRequest("parameters I_ID and QTY: expected as many of one as of the other")
        if len(ids) > MAX_CART_LINES:
            raise BadRequest(f"parameters I_ID/QTY: more than {MAX_CART_LINES} lines")
        changes = [
            (req.int("I_ID", lo=1, hi=n_items, value=i), req.int("QTY", lo=0, hi=10_000, value=q))
            for i, q in zip(ids, qtys)
        ]

    def work():
        sc_id = req.shopping_id
        # the cart row is locked: two requests on one cart (a double click) run one after the other
        if sc_id is None or s.one("SELECT sc_id FROM shopping_cart WHERE sc_id = %s FOR UPDATE", (sc_id,)) is None:
            sc_id = insert_id(s, "INSERT INTO shopping_cart (sc_time) VALUES (%s)", (now(),), "sc_id")
        if add_id is not None:
            add_item(s, sc_id, add_id)
        for i_id, qty in changes:
            if qty == 0:
                s.execute("DELETE FROM shopping_cart_line WHERE scl_sc_id = %s AND scl_i_id = %s", (sc_id, i_id))
            else:
                s.execute(
                    "UPDATE shopping_cart_line SET scl_qty = %s WHERE scl_sc_id = %s AND scl_i_id = %s",
                    (qty, sc_id, i_id),
                )
        if int(s.one("SELECT COUNT(*) AS n FROM shopping_cart_line WHERE scl_sc_id = %s", (sc_id,))["n"]) == 0:
            row = s.one("SELECT i_related1 FROM item WHERE i_id = %s", (req.app.random_item(s),))
            if row and row["i_related1"]:
                add_item(s, sc_id, int(row["i_related1"]))
        s.execute("UPDATE shopping_cart SET sc_time = %s WHERE sc_id = %s", (now(), sc_id))
        return sc_id, cart_lines(s, sc_id)

    sc_id, lines = transaction(s, work)
    req.shopping_id = sc_id
    t = totals(lines, 0.0)
    form = (
        f'<form action="{PREFIX}/ShoppingCart" method="get">\n'
        f'{req.session_fields()}<input type="hidden" name="ADD_FLAG" value="N">\n'
        + cart_table(lines, editable=True)
        + totals_html(t)
        + f'<p><input type="image" src="{pages.IMG}/refresh_B.gif" alt="Refresh"></p>\n</form>\n'
    )
    req.buttons = [
        ("CustomerRegistration", "checkout_B", "Checkout", {}),
        ("Home", "home_B", "Home", {}),
    ]
    return "Shopping cart", promo(req, s) + f"<p>Shopping cart {sc_id}: {len(lines)} lines.</p>\n" + form


def add_item(s, sc_id: int, i_id: int) -> None:
    row = s.one("SELECT scl_qty FROM shopping_cart_line WHERE scl_sc_id = %s AND scl_i_id = %s", (sc_id, i_id))
    if row:
        s.execute(
            "UPDATE shopping_cart_line SET scl_qty = %s WHERE scl_sc_id = %s AND scl_i_id = %s",
            (int(row["scl_qty"]) + 1, sc_id, i_id),
        )
    else:
        s.execute("INSERT INTO shopping_cart_line (scl_sc_id, scl_qty, scl_i_id) VALUES (%s, 1, %s)", (sc_id, i_id))


def customer_registration(req, s):
    uname = ""
    if req.c_id is not None:
        row = s.one("SELECT c_uname FROM customer WHERE c_id = %s", (req.c_id,))
        uname = row["c_uname"] if row else ""
    fields = "".join(
        f'<tr><td>{label}</td><td><input type="text" name="{name}" maxlength="{n}"></td></tr>\n'
        for label, name, n in (
            ("First name", "FNAME", 15),
            ("Last name", "LNAME", 15),
            ("Street 1", "STREET_1", 40),
            ("Street 2", "STREET_2", 40),
            ("City", "CITY", 30),
            ("State", "STATE", 20),
            ("Zip", "ZIP", 10),
            ("Country", "COUNTRY", 50),
            ("Phone", "PHONE", 18),
            ("E-mail", "EMAIL", 50),
            ("Birth date (YYYY-MM-DD)", "BIRTHDATE", 10),
            ("About you", "DATA", 500),
        )
    )
    return "Customer registration", (
        f'<form action="{PREFIX}/BuyRequest" method="get">\n{req.session_fields()}\n'
        '<p><input type="radio" name="RETURNING_FLAG" value="Y" checked> I am a returning customer: '
        f'user name <input type="text" name="UNAME" value="{esc(uname)}" maxlength="20"> '
        'password <input type="password" name="PASSWD" maxlength="20"></p>\n'
        '<p><input type="radio" name="RETURNING_FLAG" value="N"> I am a new customer:</p>\n'
        f"<table>{fields}</table>\n"
        f'<p><input type="image" src="{pages.IMG}/submit_B.gif" alt="Enter order"></p>\n</form>\n'
    )


CUSTOMER_COLUMNS = (
    "c_id, c_uname, c_fname, c_lname, c_discount, c_phone, c_email, addr_street1, addr_street2, addr_city, "
    "addr_state, addr_zip, co_name"
)


def buy_request(req, s):
    sc_id = req.int("SHOPPING_ID", lo=1)
    returning = req.choice("RETURNING_FLAG", ("Y", "N")) == "Y"
    if returning:
        uname = req.text("UNAME", 20)
        passwd = req.text("PASSWD", 20)
        cust = s.one(
            f"SELECT c_passwd, {CUSTOMER_COLUMNS} FROM customer, address, country "
            "WHERE c_addr_id = addr_id AND addr_co_id = co_id AND c_uname = %s",
            (uname,),
        )
        if cust is None:
            return sorry("Buy request", f"there is no customer {uname}.")
        if cust["c_passwd"] != passwd:
            return sorry("Buy request", "the password is incorrect.")
        t = now()
        s.execute(
            "UPDATE customer SET c_login = %s, c_expiration = %s WHERE c_id = %s",
            (t, t + timedelta(hours=2), cust["c_id"]),
        )
    else:
        f = req.address(required=True)
        f.update(
            fname=req.text("FNAME", 15),
            lname=req.text("LNAME", 15),
            phone=req.text("PHONE", 18),
            email=req.text("EMAIL", 50),
            data=req.text("DATA", 500, required=False),
        )
        birth = req.date("BIRTHDATE")
        discount = req.app.rng.randint(0, 50) / 100

        def work():
            addr_id = enter_address(s, f)
            t = now()
            c_id = insert_id(
                s,
                "INSERT INTO customer (c_uname, c_passwd, c_fname, c_lname, c_addr_id, c_phone, c_email, c_since, "
                "c_last_login, c_login, c_expiration, c_discount, c_balance, c_ytd_pmt, c_birthdate, c_data) "
                "VALUES ('', '', %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, 0, %s, %s)",
                (
                    f["fname"],
                    f["lname"],
                    addr_id,
                    f["phone"],
                    f["email"],
                    t.date(),
                    t.date(),
                    t,
                    t + timedelta(hours=2),
                    discount,
                    birth,
                    f["data"],
                ),
                "c_id",
            )
            uname = digsyl(c_id)
            s.execute("UPDATE customer SET c_uname = %s, c_passwd = %s WHERE c_id = %s", (uname, uname.lower(), c_id))
            return s.one(
                f"SELECT {CUSTOMER_COLUMNS} FROM customer, address, country "
                "WHERE c_addr_id = addr_id AND addr_co_id = co_id AND c_id = %s",
                (c_id,),
            )

        cust = transaction(s, work)
    req.c_id = int(cust["c_id"])
    req.shopping_id = sc_id
    lines = cart_lines(s, sc_id)
    tot = totals(lines, float(cust["c_discount"] or 0))
    cards = "".join(f'<option value="{c}">{c}</option>' for c in CARD_TYPES)
    ships = "".join(f'<option value="{x}">{x}</option>' for x in SHIP_TYPES)
    return "Buy request", (
        f"<p>Customer {esc(cust['c_uname'])} (C_ID {cust['c_id']}): {esc(cust['c_fname'])} {esc(cust['c_lname'])}, "
        f"{esc(cust['c_email'])}, discount {float(cust['c_discount'] or 0) * 100:.0f} %</p>\n"
        f"<p>Billing address: {esc(cust['addr_street1'])}, {esc(cust['addr_street2'])}, {esc(cust['addr_city'])}, "
        f"{esc(cust['addr_state'])} {esc(cust['addr_zip'])}, {esc(cust['co_name'])}</p>\n"
        + cart_table(lines)
        + totals_html(tot)
        + f'<form action="{PREFIX}/BuyConfirm" method="get">\n{req.session_fields()}\n'
        f'<p>Card <select name="CC_TYPE">{cards}</select> number <input type="text" name="CC_NUMBER" maxlength="20"> '
        'name on card <input type="text" name="CC_NAME" maxlength="30"> '
        'expires (YYYY-MM-DD) <input type="text" name="CC_EXPIRY" maxlength="10"></p>\n'
        f'<p>Shipping <select name="SHIPPING">{ships}</select></p>\n'
        '<p>Ship to another address: street <input type="text" name="STREET_1" maxlength="40"> '
        '<input type="text" name="STREET_2" maxlength="40"> city <input type="text" name="CITY" maxlength="30"> '
        'state <input type="text" name="STATE" maxlength="20"> zip <input type="text" name="ZIP" maxlength="10"> '
        'country <input type="text" name="COUNTRY" maxlength="50"></p>\n'
        f'<p><input type="image" src="{pages.IMG}/submit_B.gif" alt="Process order"></p>\n</form>\n'
    )


def buy_confirm(req, s):
    sc_id = req.int("SHOPPING_ID", lo=1)
    c_id = req.int("C_ID", lo=1)
    cc_type = req.choice("CC_TYPE", CARD_TYPES)
    cc_number = req.text("CC_NUMBER", 20)
    if not cc_number.isdigit():
        raise BadRequest("parameter CC_NUMBER: expected digits")
    cc_name = req.text("CC_NAME", 100)[:30]  # cut to cx_name's 30 characters, as the original did
    cc_expiry = req.date("CC_EXPIRY")
    shipping = req.choice("SHIPPING", SHIP_TYPES)
    new_addr = req.address(required=False)
    rng = req.app.rng
    comments = [random_text(rng, 20, 100) for _ in range(MAX_CART_LINES)]
    auth_id = random_text(rng, 15, 15)
    ship_days = rng.randint(1, 7)

    def work():
        if s.one("SELECT sc_id FROM shopping_cart WHERE sc_id = %s FOR UPDATE", (sc_id,)) is None:
            return None, f"there is no shopping cart {sc_id}."
        cust = s.one("SELECT c_discount, c_addr_id FROM customer WHERE c_id = %s", (c_id,))
        if cust is None:
            return None, f"there is no customer {c_id}."
        lines = cart_lines(s, sc_id)
        if not lines:
            return None, "your shopping cart is empty: nothing to order."
        discount = float(cust["c_discount"] or 0)
        t = totals(lines, discount)
        bill_addr = int(cust["c_addr_id"])
        ship_addr = enter_address(s, new_addr) if new_addr else bill_addr
        when = now()
        o_id = insert_id(
            s,
            "INSERT INTO orders (o_c_id, o_date, o_sub_total, o_tax, o_total, o_ship_type, o_ship_date, "
            "o_bill_addr_id, o_ship_addr_id, o_status) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'PENDING')",
            (
                c_id,
                when,
                t["sub"],
                t["tax"],
                t["total"],
                shipping,
                when + timedelta(days=ship_days),
                bill_addr,
                ship_addr,
            ),
            "o_id",
        )
        for k, ln in enumerate(lines, start=1):  # in i_id order: row locks taken in one order
            i_id, qty = int(ln["scl_i_id"]), int(ln["scl_qty"])
            s.execute(
                "INSERT INTO order_line (ol_id, ol_o_id, ol_i_id, ol_qty, ol_discount, ol_comments) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                (k, o_id, i_id, qty, discount, comments[(k - 1) % len(comments)]),
            )
            stock = int(s.one("SELECT i_stock FROM item WHERE i_id = %s FOR UPDATE", (i_id,))["i_stock"])
            left = stock - qty
            s.execute("UPDATE item SET i_stock = %s WHERE i_id = %s", (left + 21 if left < 10 else left, i_id))
        s.execute(
            "INSERT INTO cc_xacts (cx_o_id, cx_type, cx_num, cx_name, cx_expire, cx_auth_id, cx_xact_amt, "
            "cx_xact_date, cx_co_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, "
            "(SELECT addr_co_id FROM address WHERE addr_id = %s))",
            (o_id, cc_type, cc_number, cc_name, cc_expiry, auth_id, t["total"], when, ship_addr),
        )
        s.execute("DELETE FROM shopping_cart_line WHERE scl_sc_id = %s", (sc_id,))
        return (o_id, lines, t, when, ship_addr), None

    done, why = transaction(s, work)
    if done is None:
        return sorry("Buy confirm", why)
    o_id, lines, t, when, ship_addr = done
    req.buttons = [("SearchRequest", "search_B", "Search", {}), ("Home", "home_B", "Home", {})]
    return "Buy confirm", (
        f"<p>Thank you: your order has been processed. Order id: <b>{o_id}</b> of {fmt_date(when)}, "
        f"{len(lines)} lines, shipping {esc(shipping)} to address {ship_addr}.</p>\n"
        + cart_table(lines)
        + totals_html(t)
    )


def order_inquiry(req, s):
    uname = ""
    if req.c_id is not None:
        row = s.one("SELECT c_uname FROM customer WHERE c_id = %s", (req.c_id,))
        uname = row["c_uname"] if row else ""
    return "Order inquiry", (
        f'<form action="{PREFIX}/OrderDisplay" method="get">\n{req.session_fields()}\n'
        f'<p>User name <input type="text" name="UNAME" value="{esc(uname)}" maxlength="20"> '
        'password <input type="password" name="PASSWD" maxlength="20"></p>\n'
        f'<p><input type="image" src="{pages.IMG}/display_last_order_B.gif" alt="Display last order"></p>\n</form>\n'
    )


def order_display(req, s):
    uname = req.text("UNAME", 20)
    passwd = req.text("PASSWD", 20)
    row = s.one("SELECT c_passwd FROM customer WHERE c_uname = %s", (uname,))
    if row is None or row["c_passwd"] != passwd:
        return sorry("Order display", "the user name or the password is incorrect.")
    last = s.one(
        "SELECT o_id FROM customer, orders WHERE c_id = o_c_id AND c_uname = %s "
        "ORDER BY o_date DESC, o_id DESC LIMIT 1",
        (uname,),
    )
    if last is None:
        return sorry("Order display", f"customer {uname} has no order yet.")
    o = s.one(
        "SELECT o_id, o_date, o_sub_total, o_tax, o_total, o_ship_type, o_ship_date, o_status, "
        "c_uname, c_fname, c_lname, c_phone, c_email, cx_type, "
        "b.addr_street1 AS bill_street1, b.addr_street2 AS bill_street2, b.addr_city AS bill_city, "
        "b.addr_state AS bill_state, b.addr_zip AS bill_zip, bc.co_name AS bill_country, "
        "sa.addr_street1 AS ship_street1, sa.addr_street2 AS ship_street2, sa.addr_city AS ship_city, "
        "sa.addr_state AS ship_state, sa.addr_zip AS ship_zip, sc.co_name AS ship_country "
        "FROM orders, customer, cc_xacts, address AS b, country AS bc, address AS sa, country AS sc "
        "WHERE o_id = %s AND cx_o_id = o_id AND c_id = o_c_id AND o_bill_addr_id = b.addr_id "
        "AND b.addr_co_id = bc.co_id AND o_ship_addr_id = sa.addr_id AND sa.addr_co_id = sc.co_id",
        (last["o_id"],),
    )
    if o is None:
        return sorry("Order display", f"order {last['o_id']} is incomplete.")
    lines = s.query(
        "SELECT ol_i_id, i_title, i_publisher, i_cost, ol_qty, ol_discount, ol_comments "
        "FROM order_line, item WHERE ol_o_id = %s AND ol_i_id = i_id ORDER BY ol_id",
        (o["o_id"],),
    )
    items = "".join(
        f'<tr><td><a href="{req.link("ProductDetail", I_ID=ln["ol_i_id"])}">{esc(ln["i_title"])}</a></td>'
        f"<td>{esc(ln['i_publisher'])}</td><td>{money(ln['i_cost'])}</td><td>{ln['ol_qty']}</td>"
        f"<td>{float(ln['ol_discount'] or 0) * 100:.0f} %</td><td>{esc(ln['ol_comments'])}</td></tr>\n"
        for ln in lines
    )
    return "Order display", (
        f"<p>Order id: <b>{o['o_id']}</b>, placed {fmt_date(o['o_date'])}, status {esc(o['o_status'])}, "
        f"shipping {esc(o['o_ship_type'])} on {fmt_date(o['o_ship_date'])}, paid by {esc(o['cx_type'])}.</p>\n"
        f"<p>Customer {esc(o['c_uname'])}: {esc(o['c_fname'])} {esc(o['c_lname'])}, {esc(o['c_phone'])}, {esc(o['c_email'])}</p>\n"
        f"<p>Bill to: {esc(o['bill_street1'])}, {esc(o['bill_street2'])}, {esc(o['bill_city'])}, {esc(o['bill_state'])} "
        f"{esc(o['bill_zip'])}, {esc(o['bill_country'])}<br>Ship to: {esc(o['ship_street1'])}, {esc(o['ship_street2'])}, "
        f"{esc(o['ship_city'])}, {esc(o['ship_state'])} {esc(o['ship_zip'])}, {esc(o['ship_country'])}</p>\n"
        '<table border="1"><tr><th>Title</th><th>Publisher</th><th>Cost</th><th>Qty</th><th>Discount</th><th>Comment</th></tr>\n'
        + items
        + "</table>\n"
        f"<p>Subtotal: {money(o['o_sub_total'])}<br>Tax: {money(o['o_tax'])}<br><b>Total: {money(o['o_total'])}</b></p>\n"
        f"<p>{len(lines)} order lines.</p>\n"
    )


def admin_request(req, s):
    i_id = req.int("I_ID", lo=1)
    b = get_book(s, i_id)
    if b is None:
        return sorry("Admin request", f"there is no book with I_ID {i_id}.")
    req.buttons = [("SearchRequest", "search_B", "Search", {}), ("Home", "home_B", "Home", {})]
    return "Admin request", (
        f"<p><b>{esc(b['i_title'])}</b> by {esc(b['a_fname'])} {esc(b['a_lname'])} (I_ID {i_id})</p>\n"
        f"<p>{pages.img(b['i_image'], 'image')} {pages.img(b['i_thumbnail'], 'thumbnail', 100, 150)}</p>\n"
        f"<p>Suggested retail: {money(b['i_srp'])}, our price: {money(b['i_cost'])}</p>\n"
        f'<form action="{PREFIX}/AdminConfirm" method="get">\n{req.session_fields()}'
        f'<input type="hidden" name="I_ID" value="{i_id}">\n'
        f'<p>New price <input type="text" name="I_NEW_COST" value="{money(b["i_cost"])}" maxlength="12"><br>'
        f'New image <input type="text" name="I_NEW_IMAGE" value="{esc(b["i_image"])}" maxlength="40"><br>'
        f'New thumbnail <input type="text" name="I_NEW_THUMBNAIL" value="{esc(b["i_thumbnail"])}" maxlength="40"></p>\n'
        f'<p><input type="image" src="{pages.IMG}/submit_B.gif" alt="Update"></p>\n</form>\n'
    )


def admin_confirm(req, s):
    i_id = req.int("I_ID", lo=1)
    cost = req.number("I_NEW_COST", 0.0, 1_000_000.0)
    image = req.image_name("I_NEW_IMAGE")
    thumbnail = req.image_name("I_NEW_THUMBNAIL")
    n_items = req.app.item_count(s)

    def work():
        if (
            s.execute(
                "UPDATE item SET i_cost = %s, i_image = %s, i_thumbnail = %s, i_pub_date = CURRENT_DATE WHERE i_id = %s",
                (cost, image, thumbnail, i_id),
            )
            == 0
        ):
            return None
        rows = s.query(
            "SELECT ol_i_id FROM orders, order_line WHERE o_id = ol_o_id AND ol_i_id <> %s "
            "AND o_c_id IN (SELECT o_c_id FROM orders, order_line WHERE o_id = ol_o_id "
            "AND o_id > (SELECT MAX(o_id) - 10000 FROM orders) AND ol_i_id = %s) "
            "GROUP BY ol_i_id ORDER BY SUM(ol_qty) DESC, ol_i_id LIMIT 5",
            (i_id, i_id),
        )
        related = [int(r["ol_i_id"]) for r in rows]
        last = related[-1] if related else i_id
        while len(related) < 5:  # fewer than 5 co-purchased books: the next distinct ids
            last = last % max(n_items, 6) + 1
            if last != i_id and last not in related:
                related.append(last)
        s.execute(
            "UPDATE item SET i_related1 = %s, i_related2 = %s, i_related3 = %s, i_related4 = %s, i_related5 = %s "
            "WHERE i_id = %s",
            (*related, i_id),
        )
        return get_book(s, i_id), related

    done = transaction(s, work)
    if done is None:
        return sorry("Admin confirm", f"there is no book with I_ID {i_id}.")
    b, related = done
    req.buttons = [("SearchRequest", "search_B", "Search", {}), ("Home", "home_B", "Home", {})]
    links = ", ".join(f'<a href="{req.link("ProductDetail", I_ID=r)}">{r}</a>' for r in related)
    return "Admin confirm", (
        "<p>The book has been updated.</p>\n"
        + book_details(req, b)
        + f"<p>{pages.img(b['i_thumbnail'], 'thumbnail', 100, 150)}</p>\n<p>Related books: {links}</p>\n"
    )


#: script name -> handler
INTERACTIONS = {
    "Home": home,
    "NewProducts": new_products,
    "BestSellers": best_sellers,
    "ProductDetail": product_detail,
    "SearchRequest": search_request,
    "SearchResults": search_results,
    "ShoppingCart": shopping_cart,
    "CustomerRegistration": customer_registration,
    "BuyRequest": buy_request,
    "BuyConfirm": buy_confirm,
    "OrderInquiry": order_inquiry,
    "OrderDisplay": order_display,
    "AdminRequest": admin_request,
    "AdminConfirm": admin_confirm,
}

#: the buttons (target script, gif, alt text, parameters) of a page unless its handler sets others
NAV: dict[str, list[tuple[str, str, str, dict[str, str]]]] = {
    "Home": [
        ("ShoppingCart", "shopping_cart_B", "Shopping cart", {}),
        ("SearchRequest", "search_B", "Search", {}),
        ("OrderInquiry", "order_status_B", "Order status", {}),
    ],
    "CustomerRegistration": [("Home", "home_B", "Home", {}), ("SearchRequest", "search_B", "Search", {})],
    "BuyRequest": [("Home", "home_B", "Home", {}), ("ShoppingCart", "shopping_cart_B", "Shopping cart", {})],
    "OrderInquiry": [("SearchRequest", "search_B", "Search", {}), ("Home", "home_B", "Home", {})],
    "OrderDisplay": [("SearchRequest", "search_B", "Search", {}), ("Home", "home_B", "Home", {})],
}
NAV_DEFAULT: list[tuple[str, str, str, dict[str, str]]] = [
    ("ShoppingCart", "shopping_cart_B", "Shopping cart", {}),
    ("SearchRequest", "search_B", "Search", {}),
    ("Home", "home_B", "Home", {}),
]


class BookstoreApp:
    """The WSGI application."""

    def __init__(self, config: AppConfig):
        self.config = config
        self.db = Database(config.db)
        self.rng = random.Random()
        self._items = config.items

    def item_count(self, s) -> int:
        """Items in the store (TPCW_ITEMS, or MAX(i_id) asked once)."""
        if self._items <= 0:
            row = s.one("SELECT MAX(i_id) AS n FROM item")
            self._items = int(row["n"] or 0) if row else 0
            if self._items <= 0:
                raise DatabaseError("the item table is empty")
        return self._items

    def random_item(self, s) -> int:
        return self.rng.randint(1, self.item_count(s))

    def __call__(self, environ, start_response):
        return web.serve(environ, start_response, self._dispatch)

    def _dispatch(self, environ, path, method, rid, t0):
        if path in ("/", PREFIX, PREFIX + "/"):
            path = PREFIX + "/Home"
        if path == PREFIX + "/health":
            return web.health(self.db, rid)
        script = path[len(PREFIX) + 1 :] if path.startswith(PREFIX + "/") else None
        handler = INTERACTIONS.get(script) if script else None
        if handler is None:
            return "404 Not Found", web.HTML, pages.page("Not found", f"<p>No such page: {esc(path)}</p>\n").encode()
        assert script is not None  # the handler was found by it
        if method not in ("GET", "POST", "HEAD"):
            return (
                "405 Method Not Allowed",
                web.HTML,
                pages.page("Bad request", "<p>Method not allowed.</p>\n").encode(),
            )
        try:
            req = Request(environ, rid, self)
            with self.db.session(rid) as s:
                title, content = handler(req, s)
            buttons = " ".join(
                pages.button(req.link(target, **params), name, alt)
                for target, name, alt, params in (
                    req.buttons if req.buttons is not None else NAV.get(script, NAV_DEFAULT)
                )
            )
            text = pages.page(title, content, buttons, (time.perf_counter() - t0) * 1000)
            return "200 OK", web.HTML, text.encode()
        except Exception as err:  # 400 for a malformed request; a failure logged, answered without its trace
            return web.failure(err, rid, script, pages.page, log)


def create_app(config: AppConfig | None = None) -> BookstoreApp:
    """The WSGI application (gunicorn: `tierscope.apps.bookstore.app:create_app()`)."""
    web.log_to_stderr()
    return BookstoreApp(config or AppConfig.from_env())
