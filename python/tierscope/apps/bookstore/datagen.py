"""A deterministic (seeded) TPC-W bookstore data generator with a fast bulk load.

Population rules (research note phase2-workloads §1.1, TPC-W clause 4.7 as the Wisconsin and TPC
DBGEN kits implement it):
- items ∈ {1 000, 10 000, 100 000, 1 000 000} (`ITEM_COUNTS`); authors = items / 4; customers =
  2880 × EBs; addresses = 2 × customers; orders = 0.9 × customers, each with 1-5 order lines (distinct
  items) and one cc_xacts row; 92 countries; 24 subjects;
- c_uname = DigSyl(c_id), c_passwd = lower(c_uname) (so the emulator can log in as any C_ID);
- searchable names: every a_lname STARTS with a 7-syllable DigSyl token (optionally followed by a
  few letters) and every i_title starts with one followed by words. Authors 1..items/10+1 carry the
  tokens DigSyl(0..items/10, 7) in order and items 1..items/5+1 the tokens DigSyl(0..items/5, 7); the
  others get a random token of the same range. The emulator searches for DigSyl(NURand(A, 0,
  items/10), 7) (author) and DigSyl(NURand(A, 0, items/5), 7) (title) with a prefix LIKE, so every
  search it makes finds at least one item (Wisconsin fills these columns with random letters, so
  its searches almost never hit; the spec's DBGEN embeds the tokens as here);
- first 25 % of items have i_a_id = i_id, the rest a random author; i_stock 10-30; i_cost = i_srp ×
  (1 - 0..50 %); 5 distinct random related items (never the item itself); images
  `img{i mod 100}/thumb_{i}.gif` and `img{i mod 100}/image_{i}.gif`;
- order dates increase with o_id over the 60 days before the load time (so "the latest order" and
  "the last 3,333 orders" agree), qty 1-300, discount 0-30 %, status in {PROCESSING, SHIPPED,
  PENDING, DENIED}, 6 ship types, 5 card types; o_total = sub-total + 8.25 % tax + 3.00 + 1.00 per
  line; cc_xacts.cx_xact_amt = o_total.

The same (items, EBs, seed, load time) give the same rows: every table has its own random stream,
so the tables are generated in parallel processes (into tab-separated files), then bulk-loaded:
COPY on PostgreSQL, LOAD DATA LOCAL INFILE on MariaDB (multi-row INSERT batches when the server
refuses LOCAL INFILE). Tables first, then rows, then the secondary indexes, the id sequences past
the loaded ids (PostgreSQL; InnoDB does it itself) and statistics.

`digsyl`, `nurand`, `item_a`, `customer_a`, `SUBJECTS`, `COUNTRIES`, `CARD_TYPES`, `SHIP_TYPES` are
what an emulator needs to make requests that match this data.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

from tierscope.apps import bulkload
from tierscope.contracts.dbms import DbConfig

#: bumped when the same (items, ebs, seed) would give different rows, or a scale name another size
#: (3: `paper` went from 100 k to 1 M items); older snapshots are reloaded
GENERATOR_VERSION = 3

HERE = Path(__file__).parent

#: the item counts TPC-W allows (the emulator's NURand A for search strings depends on them)
ITEM_COUNTS = (1_000, 10_000, 100_000, 1_000_000)

#: name -> (items, emulated browsers): TPC-W's item counts 1 k / 10 k / 100 k / 1 M. Measured on
#: 2 cores: tiny (217 k rows, 50-60 MB) loads in about 2 s (the tests), small (2.2 M rows, about
#: 0.5 GB; the size of seed 004's 450 MB database) in 15-20 s, large (22 M rows, 4.9 GB) in about
#: 2.5 min; paper is TPC-W's 1 M items with large's 1,000 EBs (2.88 M customers, 22.9 M rows).
SCALES: dict[str, tuple[int, int]] = {
    "tiny": (1_000, 10),
    "small": (10_000, 100),
    "large": (100_000, 1_000),
    "paper": (1_000_000, 1_000),
}

SUBJECTS = (
    "ARTS",
    "BIOGRAPHIES",
    "BUSINESS",
    "CHILDREN",
    "COMPUTERS",
    "COOKING",
    "HEALTH",
    "HISTORY",
    "HOME",
    "HUMOR",
    "LITERATURE",
    "MYSTERY",
    "NON-FICTION",
    "PARENTING",
    "POLITICS",
    "REFERENCE",
    "RELIGION",
    "ROMANCE",
    "SELF-HELP",
    "SCIENCE-NATURE",
    "SCIENCE-FICTION",
    "SPORTS",
    "YOUTH",
    "TRAVEL",
)
BACKINGS = ("HARDBACK", "PAPERBACK", "USED", "AUDIO", "LIMITED-EDITION")
CARD_TYPES = ("VISA", "MASTERCARD", "DISCOVER", "AMEX", "DINERS")
SHIP_TYPES = ("AIR", "UPS", "FEDEX", "SHIP", "COURIER", "MAIL")
ORDER_STATUSES = ("PROCESSING", "SHIPPED", "PENDING", "DENIED")

#: the 92 countries (co_id = position + 1, names spelt as the Wisconsin kit, which emulators
#: send as COUNTRY) and their currencies
COUNTRIES: tuple[tuple[str, str], ...] = (
    ("United States", "Dollars"),
    ("United Kingdom", "Pounds"),
    ("Canada", "Dollars"),
    ("Germany", "Euros"),
    ("France", "Euros"),
    ("Japan", "Yen"),
    ("Netherlands", "Euros"),
    ("Italy", "Euros"),
    ("Switzerland", "Francs"),
    ("Australia", "Dollars"),
    ("Algeria", "Dinars"),
    ("Argentina", "Pesos"),
    ("Armenia", "Dram"),
    ("Austria", "Euros"),
    ("Azerbaijan", "Manat"),
    ("Bahamas", "Dollars"),
    ("Bahrain", "Dinar"),
    ("Bangla Desh", "Taka"),
    ("Barbados", "Dollars"),
    ("Belarus", "Rouble"),
    ("Belgium", "Euros"),
    ("Bermuda", "Dollars"),
    ("Bolivia", "Boliviano"),
    ("Botswana", "Pula"),
    ("Brazil", "Real"),
    ("Bulgaria", "Lev"),
    ("Cayman Islands", "Dollars"),
    ("Chad", "Franc"),
    ("Chile", "Pesos"),
    ("China", "Yuan Renminbi"),
    ("Christmas Island", "Dollars"),
    ("Colombia", "Pesos"),
    ("Croatia", "Euros"),
    ("Cuba", "Pesos"),
    ("Cyprus", "Euros"),
    ("Czech Republic", "Koruna"),
    ("Denmark", "Kroner"),
    ("Dominican Republic", "Pesos"),
    ("Eastern Caribbean", "Dollars"),
    ("Ecuador", "Dollars"),
    ("Egypt", "Pounds"),
    ("El Salvador", "Colon"),
    ("Estonia", "Euros"),
    ("Ethiopia", "Birr"),
    ("Falkland Island", "Pound"),
    ("Faroe Island", "Krone"),
    ("Fiji", "Dollars"),
    ("Finland", "Euros"),
    ("Gabon", "Franc"),
    ("Gibraltar", "Pound"),
    ("Greece", "Euros"),
    ("Guam", "Dollars"),
    ("Hong Kong", "Dollars"),
    ("Hungary", "Forint"),
    ("Iceland", "Krona"),
    ("India", "Rupees"),
    ("Indonesia", "Rupiah"),
    ("Iran", "Rial"),
    ("Iraq", "Dinar"),
    ("Ireland", "Euros"),
    ("Israel", "Shekels"),
    ("Jamaica", "Dollars"),
    ("Jordan", "Dinar"),
    ("Kazakhstan", "Tenge"),
    ("Kuwait", "Dinar"),
    ("Lebanon", "Pounds"),
    ("Luxembourg", "Euros"),
    ("Malaysia", "Ringgit"),
    ("Mexico", "Pesos"),
    ("Mauritius", "Rupees"),
    ("New Zealand", "Dollars"),
    ("Norway", "Kroner"),
    ("Pakistan", "Rupees"),
    ("Philippines", "Pesos"),
    ("Poland", "Zloty"),
    ("Portugal", "Euros"),
    ("Romania", "Leu"),
    ("Russia", "Rubles"),
    ("Saudi Arabia", "Riyal"),
    ("Singapore", "Dollars"),
    ("Slovakia", "Euros"),
    ("South Africa", "Rand"),
    ("South Korea", "Won"),
    ("Spain", "Euros"),
    ("Sudan", "Pounds"),
    ("Sweden", "Krona"),
    ("Taiwan", "Dollars"),
    ("Thailand", "Baht"),
    ("Trinidad", "Dollars"),
    ("Turkey", "Lira"),
    ("Venezuela", "Bolivar"),
    ("Zambia", "Kwacha"),
)
assert len(COUNTRIES) == 92

TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "country": ("co_id", "co_name", "co_exchange", "co_currency"),
    "author": ("a_id", "a_fname", "a_lname", "a_mname", "a_dob", "a_bio"),
    "item": (
        "i_id",
        "i_title",
        "i_a_id",
        "i_pub_date",
        "i_publisher",
        "i_subject",
        "i_desc",
        "i_related1",
        "i_related2",
        "i_related3",
        "i_related4",
        "i_related5",
        "i_thumbnail",
        "i_image",
        "i_srp",
        "i_cost",
        "i_avail",
        "i_stock",
        "i_isbn",
        "i_page",
        "i_backing",
        "i_dimensions",
    ),
    "customer": (
        "c_id",
        "c_uname",
        "c_passwd",
        "c_fname",
        "c_lname",
        "c_addr_id",
        "c_phone",
        "c_email",
        "c_since",
        "c_last_login",
        "c_login",
        "c_expiration",
        "c_discount",
        "c_balance",
        "c_ytd_pmt",
        "c_birthdate",
        "c_data",
    ),
    "address": ("addr_id", "addr_street1", "addr_street2", "addr_city", "addr_state", "addr_zip", "addr_co_id"),
    "orders": (
        "o_id",
        "o_c_id",
        "o_date",
        "o_sub_total",
        "o_tax",
        "o_total",
        "o_ship_type",
        "o_ship_date",
        "o_bill_addr_id",
        "o_ship_addr_id",
        "o_status",
    ),
    "order_line": ("ol_id", "ol_o_id", "ol_i_id", "ol_qty", "ol_discount", "ol_comments"),
    "cc_xacts": (
        "cx_o_id",
        "cx_type",
        "cx_num",
        "cx_name",
        "cx_expire",
        "cx_auth_id",
        "cx_xact_amt",
        "cx_xact_date",
        "cx_co_id",
    ),
    "shopping_cart": ("sc_id", "sc_time"),
    "shopping_cart_line": ("scl_sc_id", "scl_qty", "scl_i_id"),
}
TABLES = tuple(TABLE_COLUMNS)
#: table -> its id column backed by a sequence (PostgreSQL identity / MariaDB AUTO_INCREMENT)
ID_COLUMNS = {
    "author": "a_id",
    "item": "i_id",
    "customer": "c_id",
    "address": "addr_id",
    "orders": "o_id",
    "shopping_cart": "sc_id",
}
#: generation groups (each one process; orders, order_line and cc_xacts come from one pass)
GROUPS: tuple[tuple[str, ...], ...] = (
    ("customer",),
    ("address", "country", "author"),
    ("item",),
    ("orders", "order_line", "cc_xacts"),
)

TAX_RATE = 0.0825
SYLLABLES = ("BA", "OG", "AL", "RI", "RE", "SE", "AT", "UL", "IN", "NG")
SEARCH_SYLLABLES = 7  # the emulator's search strings are DigSyl(n, 7)


# --- the functions the emulator shares ----------------------------------------------------------


def digsyl(n: int, width: int = 0) -> str:
    """TPC-W DigSyl: each decimal digit of `n` as a syllable (0 -> BA ... 9 -> NG); with `width`
    > 0 the number is zero-padded (or cut to its last `width` digits) to exactly `width` syllables."""
    if n < 0:
        raise ValueError(f"digsyl: expected n >= 0, got {n}")
    digits = str(n)
    if width > 0:
        digits = digits.zfill(width)[-width:]
    return "".join(SYLLABLES[ord(d) - 48] for d in digits)


def nurand(rng: random.Random, a: int, x: int, y: int) -> int:
    """TPC-W NURand(A, x, y) = ((rand[0, A] | rand[x, y]) mod (y - x + 1)) + x (no TPC-C "+C")."""
    return ((rng.randint(0, a) | rng.randint(x, y)) % (y - x + 1)) + x


def item_a(items: int) -> int:
    """NURand's A for search strings at `items` items (RBE's table)."""
    table = {1_000: 63, 10_000: 511, 100_000: 4095, 1_000_000: 32767, 10_000_000: 524287}
    try:
        return table[items]
    except KeyError:
        raise ValueError(f"items: expected one of {sorted(table)}, got {items}") from None


def customer_a(customers: int) -> int:
    """NURand's A for customer ids at `customers` customers (RBE's table)."""
    a, hi = 1023, 9_999
    while customers > hi:
        a = a * 4 + 3
        hi = hi * 4 + 3
    return a


def population(items: int, ebs: int) -> dict[str, int]:
    """Rows per table the rules give (order_line: the expected mean, 3 per order)."""
    customers = 2880 * ebs
    orders = customers * 9 // 10
    return {
        "country": len(COUNTRIES),
        "author": items // 4,
        "item": items,
        "customer": customers,
        "address": 2 * customers,
        "orders": orders,
        "order_line": 3 * orders,
        "cc_xacts": orders,
        "shopping_cart": 0,
        "shopping_cart_line": 0,
    }


def check_scale(items: int, ebs: int) -> None:
    if items not in ITEM_COUNTS:
        raise ValueError(f"items: expected one of {ITEM_COUNTS}, got {items}")
    if not isinstance(ebs, int) or ebs < 1:
        raise ValueError(f"ebs: expected an integer >= 1, got {ebs!r}")


def scale_named(name: str) -> tuple[int, int]:
    try:
        return SCALES[name]
    except KeyError:
        raise ValueError(f"scale {name!r}: expected one of {', '.join(SCALES)}") from None


# --- row generation ---------------------------------------------------------------------------

ALPHA = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
POOL = 1 << 20
EPOCH = date(1800, 1, 1)


class Generator:
    """Rows of every table as tab-separated lines, written table by table (deterministic)."""

    def __init__(self, items: int, ebs: int, seed: int = 42, now: datetime | None = None):
        check_scale(items, ebs)
        self.items, self.ebs, self.seed = items, ebs, seed
        self.authors = items // 4
        self.customers = 2880 * ebs
        self.addresses = 2 * self.customers
        self.orders = self.customers * 9 // 10
        self.now = (now or datetime.now()).replace(microsecond=0)
        self.today = self.now.date()
        r = random.Random(f"{seed}:pools")
        self.letters = "".join(r.choices(ALPHA, k=POOL + 600))
        self.digits = "".join(r.choices("0123456789", k=(1 << 16) + 40))
        # words: lower-case letters with a space every 2-10 characters
        chars = list("".join(r.choices("abcdefghijklmnopqrstuvwxyz", k=POOL + 600)))
        starts, pos = [0], 0
        while True:
            pos += 3 + int(r.random() * 9)
            if pos >= POOL:
                break
            chars[pos - 1] = " "
            starts.append(pos)
        self.words = "".join(chars)
        self.word_starts = starts
        self._days: dict[int, str] = {}

    def rng(self, table: str) -> random.Random:
        """An independent stream per table, so tables can be generated alone (and in parallel)."""
        return random.Random(f"{self.seed}:{table}")

    # text and dates (r = a stream's random() method)

    def astr(self, r, lo: int, hi: int) -> str:
        n = lo + int(r() * (hi - lo + 1))
        off = int(r() * POOL)
        return self.letters[off : off + n]

    def nstr(self, r, lo: int, hi: int) -> str:
        n = lo + int(r() * (hi - lo + 1))
        off = int(r() * (1 << 16))
        return self.digits[off : off + n]

    def text(self, r, lo: int, hi: int) -> str:
        n = lo + int(r() * (hi - lo + 1))
        s = self.word_starts[int(r() * len(self.word_starts))]
        return self.words[s : s + n].rstrip() or "book"

    def day(self, k: int) -> str:
        """EPOCH + k days as YYYY-MM-DD (cached)."""
        s = self._days.get(k)
        if s is None:
            s = self._days[k] = (EPOCH + timedelta(days=k)).isoformat()
        return s

    def day_of(self, d: date) -> int:
        return (d - EPOCH).days

    def stamp(self, t: datetime) -> str:
        return t.strftime("%Y-%m-%d %H:%M:%S")

    # tables (each yields its lines)

    def country(self):
        r = self.rng("country").random
        for i, (name, currency) in enumerate(COUNTRIES, start=1):
            rate = 1.0 if i == 1 else round(10 ** (r() * 4 - 1), 4)  # 0.1 .. 1000 per dollar
            yield f"{i}\t{name}\t{rate}\t{currency}"

    def author(self):
        r = self.rng("author").random
        hi = self.items // 10  # the emulator's author strings are DigSyl(NURand(A, 0, items/10), 7)
        first_dob, last_dob = self.day_of(date(1800, 1, 1)), self.day_of(date(1990, 12, 31))
        for a in range(1, self.authors + 1):
            k = a - 1 if a - 1 <= hi else int(r() * (hi + 1))
            lname = digsyl(k, SEARCH_SYLLABLES)
            if r() < 0.25:
                lname += self.astr(r, 1, 6)
            dob = self.day(first_dob + int(r() * (last_dob - first_dob + 1)))
            yield (f"{a}\t{self.astr(r, 3, 20)}\t{lname}\t{self.astr(r, 1, 20)}\t{dob}\t{self.astr(r, 125, 500)}")

    def item(self):
        r = self.rng("item").random
        n, authors = self.items, self.authors
        hi = n // 5  # the emulator's title strings are DigSyl(NURand(A, 0, items/5), 7)
        first_pub, last_pub = self.day_of(date(1930, 1, 1)), self.day_of(date(2000, 12, 31))
        for i in range(1, n + 1):
            k = i - 1 if i - 1 <= hi else int(r() * (hi + 1))
            title = digsyl(k, SEARCH_SYLLABLES) + " " + self.text(r, 10, 45)
            a_id = i if i <= authors else 1 + int(r() * authors)
            pub = first_pub + int(r() * (last_pub - first_pub + 1))
            related: list[int] = []
            while len(related) < 5:
                j = 1 + int(r() * n)
                if j != i and j not in related:
                    related.append(j)
            srp_cents = 100 + int(r() * 99900)
            cost = round(srp_cents * (100 - int(r() * 51)) / 10000, 2)
            dims = "x".join(str((1 + int(r() * 9999)) / 100) for _ in range(3))
            d = i % 100
            yield (
                f"{i}\t{title}\t{a_id}\t{self.day(pub)}\t{self.astr(r, 14, 60)}\t"
                f"{SUBJECTS[int(r() * 24)]}\t{self.text(r, 100, 500)}\t"
                f"{related[0]}\t{related[1]}\t{related[2]}\t{related[3]}\t{related[4]}\t"
                f"img{d}/thumb_{i}.gif\timg{d}/image_{i}.gif\t{srp_cents / 100}\t{cost}\t"
                f"{self.day(pub + 1 + int(r() * 30))}\t{10 + int(r() * 21)}\t{self.astr(r, 13, 13)}\t"
                f"{20 + int(r() * 9980)}\t{BACKINGS[int(r() * 5)]}\t{dims}"
            )

    def customer(self):
        r = self.rng("customer").random
        today = self.day_of(self.today)
        login = self.stamp(self.now)
        expiration = self.stamp(self.now + timedelta(hours=2))
        first_birth, last_birth = self.day_of(date(1880, 1, 1)), self.day_of(date(2000, 12, 31))
        n_addr = self.addresses
        for c in range(1, self.customers + 1):
            uname = digsyl(c)
            since = today - 1 - int(r() * 730)
            last = min(today, since + int(r() * 61))
            yield (
                f"{c}\t{uname}\t{uname.lower()}\t{self.astr(r, 8, 15)}\t{self.astr(r, 8, 15)}\t"
                f"{1 + int(r() * n_addr)}\t{self.nstr(r, 9, 16)}\t{uname}@{self.astr(r, 2, 9)}.com\t"
                f"{self.day(since)}\t{self.day(last)}\t{login}\t{expiration}\t{int(r() * 51) / 100}\t"
                f"0.0\t{int(r() * 100000) / 100}\t"
                f"{self.day(first_birth + int(r() * (last_birth - first_birth + 1)))}\t"
                f"{self.astr(r, 100, 500)}"
            )

    def address(self):
        r = self.rng("address").random
        for a in range(1, self.addresses + 1):
            yield (
                f"{a}\t{self.astr(r, 15, 40)}\t{self.astr(r, 15, 40)}\t{self.astr(r, 4, 30)}\t"
                f"{self.astr(r, 2, 20)}\t{self.astr(r, 5, 10)}\t{1 + int(r() * 92)}"
            )

    def orders_lines_xacts(self, write: Callable[[str, list[str]], None], batch: int = 5000) -> None:
        """orders, order_line and cc_xacts in one pass (they share each order's lines and total)."""
        r = self.rng("orders").random
        n_orders, n_items, n_cust, n_addr = self.orders, self.items, self.customers, self.addresses
        span = 60 * 86400
        start = self.now - timedelta(seconds=span)
        today = self.day_of(self.today)
        out_o: list[str] = []
        out_l: list[str] = []
        out_x: list[str] = []
        for o in range(1, n_orders + 1):
            n = 1 + int(r() * 5)
            when = start + timedelta(seconds=int(span * (o - 1 + r()) / n_orders))
            o_date = self.stamp(when)
            ship_date = self.stamp(when + timedelta(days=int(r() * 8)))
            sub = (1000 + int(r() * 999000)) / 100
            tax = round(sub * TAX_RATE, 2)
            total = round(sub + tax + 3.00 + n, 2)
            out_o.append(
                f"{o}\t{1 + int(r() * n_cust)}\t{o_date}\t{sub}\t{tax}\t{total}\t"
                f"{SHIP_TYPES[int(r() * 6)]}\t{ship_date}\t{1 + int(r() * n_addr)}\t"
                f"{1 + int(r() * n_addr)}\t{ORDER_STATUSES[int(r() * 4)]}"
            )
            chosen: list[int] = []
            while len(chosen) < n:
                i = 1 + int(r() * n_items)
                if i not in chosen:
                    chosen.append(i)
            for k, i in enumerate(chosen, start=1):
                out_l.append(f"{k}\t{o}\t{i}\t{1 + int(r() * 300)}\t{int(r() * 31) / 100}\t{self.astr(r, 20, 100)}")
            out_x.append(
                f"{o}\t{CARD_TYPES[int(r() * 5)]}\t{self.nstr(r, 16, 16)}\t{self.astr(r, 14, 30)}\t"
                f"{self.day(today + 10 + int(r() * 721))}\t{self.astr(r, 15, 15)}\t{total}\t{o_date}\t"
                f"{1 + int(r() * 92)}"
            )
            if len(out_o) >= batch:
                write("orders", out_o)
                write("order_line", out_l)
                write("cc_xacts", out_x)
                out_o, out_l, out_x = [], [], []
        write("orders", out_o)
        write("order_line", out_l)
        write("cc_xacts", out_x)

    def write_group(self, tables: tuple[str, ...], directory: Path) -> dict[str, int]:
        """Write `tables` (one of GROUPS) as `<table>.tsv` under `directory`; rows per table."""
        # closed together in the finally below
        files = {t: open(Path(directory) / f"{t}.tsv", "w", encoding="utf-8", newline="\n") for t in tables}  # noqa: SIM115
        counts = dict.fromkeys(tables, 0)

        def write(table: str, lines: list[str]) -> None:
            if lines:
                files[table].write("\n".join(lines) + "\n")
                counts[table] += len(lines)

        try:
            if tables == ("orders", "order_line", "cc_xacts"):
                self.orders_lines_xacts(write)
            else:
                for t in tables:
                    buf: list[str] = []
                    for line in getattr(self, t)():
                        buf.append(line)
                        if len(buf) >= 5000:
                            write(t, buf)
                            buf = []
                    write(t, buf)
        finally:
            for f in files.values():
                f.close()
        return counts


def write_tables(
    items: int, ebs: int, seed: int, now: datetime, directory: Path, workers: int | None = None
) -> dict[str, int]:
    """Write every loaded table as `<table>.tsv` under `directory`; rows per table. With `workers`
    > 1 the GROUPS are written by that many child processes at once (`python -m` this module, so
    nothing depends on how the caller's main module imports); by default one process per group
    up to the CPU count for a million rows or more, none below."""
    if workers is None:
        big = sum(population(items, ebs).values()) >= 1_000_000
        workers = min(len(GROUPS), os.cpu_count() or 1) if big else 1
    counts: dict[str, int] = {}
    if workers <= 1:
        gen = Generator(items, ebs, seed, now)
        for g in GROUPS:
            counts.update(gen.write_group(g, directory))
        return counts
    pending = list(GROUPS)
    running: list[tuple[subprocess.Popen, tuple[str, ...]]] = []
    try:
        while pending or running:
            while pending and len(running) < workers:
                g = pending.pop(0)
                job = {
                    "items": items,
                    "ebs": ebs,
                    "seed": seed,
                    "now": now.isoformat(),
                    "tables": list(g),
                    "directory": str(directory),
                }
                running.append(
                    (
                        subprocess.Popen(
                            [sys.executable, "-m", "tierscope.apps.bookstore.datagen", json.dumps(job)],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            text=True,
                        ),
                        g,
                    )
                )
            proc, g = running.pop(0)
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"generating {', '.join(g)} failed (exit {proc.returncode}): {err.strip()[-2000:]}")
            counts.update(json.loads(out))
    finally:
        for proc, _ in running:
            proc.kill()
            proc.wait()
    return counts


def _main(argv: list[str]) -> int:
    """Child process of `write_tables`: write one group, print its row counts as JSON."""
    job = json.loads(argv[0])
    gen = Generator(job["items"], job["ebs"], job["seed"], datetime.fromisoformat(job["now"]))
    print(json.dumps(gen.write_group(tuple(job["tables"]), Path(job["directory"]))))
    return 0


# --- loading ----------------------------------------------------------------------------------


@dataclass
class LoadReport(bulkload.LoadReport):
    """A bookstore load's report (`bulkload.LoadReport`) at `items` items and `ebs` emulated
    browsers, with the seconds its generation took (of `seconds`)."""

    items: int = 0
    ebs: int = 0
    generate_seconds: float = 0.0

    def lines(self) -> list[str]:
        out = self.table_lines(20)
        out.append(
            f"total {self.total_rows} rows in {self.seconds:.1f} s (generation {self.generate_seconds:.1f} s, "
            f"{self.bytes_loaded / 1e6:.1f} MB of text, {self.method}); database size {self.db_size_bytes / 1e6:.1f} MB"
        )
        return out


def generate(
    db_config: DbConfig,
    items: int,
    ebs: int,
    seed: int = 42,
    now: datetime | None = None,
    progress: Callable[[str], None] | None = None,
    workers: int | None = None,
) -> LoadReport:
    """Create the schema in `db_config.database` (dropping the tables first) and bulk-load the
    bookstore for `items` items and `ebs` emulated browsers; return rows per table, seconds,
    bytes of text loaded and the database size in bytes."""
    check_scale(items, ebs)
    say = progress or (lambda _m: None)
    now = (now or datetime.now()).replace(microsecond=0)
    t0 = time.perf_counter()
    bulkload.ensure_database(db_config)
    with tempfile.TemporaryDirectory(prefix="tpcw-load-") as tmp:
        directory = Path(tmp)
        rows = write_tables(items, ebs, seed, now, directory, workers)
        t_gen = time.perf_counter() - t0
        say(f"generated {sum(rows.values())} rows in {t_gen:.1f} s")
        nbytes = sum((directory / f"{t}.tsv").stat().st_size for t in rows)
        if db_config.dbms == "postgresql":
            method, size = _load_postgres(db_config, directory, rows, say)
        else:
            method, size = _load_mariadb(db_config, directory, rows, say)
    for t in TABLES:
        rows.setdefault(t, 0)
    ordered = {t: rows[t] for t in TABLES}
    seconds = time.perf_counter() - t0
    return LoadReport(
        db_config.dbms, ordered, seconds, nbytes, int(size), method, items=items, ebs=ebs, generate_seconds=t_gen
    )


def load(
    db_config: DbConfig,
    scale: str = "tiny",
    seed: int = 42,
    now: datetime | None = None,
    progress: Callable[[str], None] | None = None,
) -> LoadReport:
    """`generate` for a named scale of `SCALES`."""
    items, ebs = scale_named(scale)
    return generate(db_config, items, ebs, seed, now, progress)


def _load_postgres(cfg: DbConfig, directory: Path, rows: dict[str, int], say) -> tuple[str, int]:
    import psycopg

    tables_sql, index_sql = bulkload.schema_parts(HERE, "postgresql")
    with psycopg.connect(bulkload.pg_conninfo(cfg), autocommit=True) as conn:
        for stmt in tables_sql:
            conn.execute(stmt)
        for table in TABLES:
            if table not in rows:
                continue
            cols = ", ".join(TABLE_COLUMNS[table])
            with (
                conn.cursor() as cur,
                cur.copy(f"COPY {table} ({cols}) FROM STDIN") as cp,
                open(directory / f"{table}.tsv", "rb") as f,
            ):
                while chunk := f.read(1 << 20):
                    cp.write(chunk)
            say(f"{table}: {rows[table]} rows")
        conn.execute("SET maintenance_work_mem = '256MB'")
        for stmt in index_sql:
            conn.execute(stmt)
        say("indexes built")
        for table, col in ID_COLUMNS.items():
            conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', '{col}'), "
                f"COALESCE((SELECT MAX({col}) FROM {table}), 0) + 1, false)"
            )
        conn.execute("VACUUM ANALYZE")
        size = bulkload.postgres_size(conn)
    return "COPY", size


def _load_mariadb(cfg: DbConfig, directory: Path, rows: dict[str, int], say) -> tuple[str, int]:
    tables_sql, index_sql = bulkload.schema_parts(HERE, "mariadb")
    conn = bulkload.connect_mariadb(cfg)
    method = bulkload.LOCAL_INFILE
    try:
        with conn.cursor() as cur:
            bulkload.begin_mariadb(cur, tables_sql)
            for table in TABLES:
                if table not in rows:
                    continue
                path = directory / f"{table}.tsv"
                method = bulkload.load_tsv_mariadb(cur, table, TABLE_COLUMNS[table], path, method, say)
                say(f"{table}: {rows[table]} rows")
            size = bulkload.finish_mariadb(cur, index_sql, TABLES, say)
    finally:
        conn.close()
    return method, size


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
