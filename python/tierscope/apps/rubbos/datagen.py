"""A deterministic (seeded) RUBBoS data generator with a fast bulk load.

The original RUBBoS shipped pre-built dumps and no generator (digest §0.6, §3.2); this one
respects what the client and scripts assume (digest §3.4):
- users `user<i>`/`password<i>` (i = 1..users, access 0) and authors `author<i>`/`password<i>`
  (i = 1..50, access 1, ids after the users); user 0 is the Anonymous Coward (from the schema);
- stories for about a month in `stories` and two years before that in `old_stories`, dated
  relative to the load time (so OlderStories finds stories in the last days; at the tiny
  scale's 4 a day, a single calendar day may hold none);
- comment trees per story (`comments` for new stories, `old_comments` for old ones) with
  `parent` pointing to an earlier comment of the same story and `childs` = number of direct
  replies, exactly; ratings in -1..5;
- submissions waiting for review and a moderator log;
- text from the workload dictionary (workloads/dictionary.txt): titles and subjects start with a
  dictionary word, so the search pages find matches; bodies < 1024 characters.

The same seed, scale and load time give the same rows. Bulk load: COPY on PostgreSQL, LOAD DATA
LOCAL INFILE on MariaDB (multi-row INSERT batches when the server refuses LOCAL INFILE). Tables
first, then rows, then the secondary indexes and statistics.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from tierscope.apps import bulkload
from tierscope.contracts.dbms import DbConfig

#: bumped when the same (scale, seed) would give different rows; older snapshots are reloaded
GENERATOR_VERSION = 2

HERE = Path(__file__).parent
DICTIONARY = HERE / "workloads" / "dictionary.txt"
N_CATEGORIES = 85
DAY = 86400


@dataclass(frozen=True)
class Scale:
    name: str
    users: int
    authors: int = 50
    new_days: int = 30  # days of stories in `stories`
    old_days: int = 730  # days of stories in `old_stories` (before the new ones)
    stories_per_day: float = 20.0
    old_stories_per_day: float = 20.0
    comments_per_story: float = 20.0  # mean; the count per story is uniform in [0, 2 * mean]
    submissions: int = 200
    moderator_log: int = 1000
    story_body: tuple[int, int] = (200, 1023)
    comment_body: tuple[int, int] = (20, 1023)


PRESETS: dict[str, Scale] = {
    # loads in about a second: for tests
    "tiny": Scale(
        "tiny",
        users=1000,
        new_days=30,
        old_days=60,
        stories_per_day=4,
        old_stories_per_day=2,
        comments_per_story=6,
        submissions=60,
        moderator_log=100,
    ),
    # about 100 MB on disk
    "small": Scale(
        "small",
        users=100_000,
        new_days=30,
        old_days=365,
        stories_per_day=15,
        old_stories_per_day=12,
        comments_per_story=18,
        submissions=200,
        moderator_log=5000,
    ),
    # what the original client assumes: 500 000 users, 50 authors, 2 years old + 1 month new
    "paper": Scale(
        "paper",
        users=500_000,
        new_days=30,
        old_days=730,
        stories_per_day=25,
        old_stories_per_day=25,
        comments_per_story=25,
        submissions=500,
        moderator_log=20000,
    ),
}

TABLE_COLUMNS = {
    "users": ("id", "firstname", "lastname", "nickname", "password", "email", "rating", "access", "creation_date"),
    "stories": ("id", "title", "body", "date", "writer", "category"),
    "old_stories": ("id", "title", "body", "date", "writer", "category"),
    "submissions": ("id", "title", "body", "date", "writer", "category"),
    "comments": ("id", "writer", "story_id", "parent", "childs", "rating", "date", "subject", "comment"),
    "old_comments": ("id", "writer", "story_id", "parent", "childs", "rating", "date", "subject", "comment"),
    "moderator_log": ("id", "moderator_id", "comment_id", "rating", "date"),
}
TABLES = ("categories", "users", "stories", "old_stories", "submissions", "comments", "old_comments", "moderator_log")

RATINGS = (-1, 0, 1, 2, 3, 4, 5)
RATING_WEIGHTS = (5, 40, 25, 15, 8, 5, 2)


def scale_named(name: str) -> Scale:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"scale {name!r}: expected one of {', '.join(PRESETS)}") from None


def load_words(path: Path = DICTIONARY) -> list[str]:
    words = [w.strip() for w in path.read_text().splitlines() if w.strip()]
    if not words:
        raise ValueError(f"{path}: no words")
    return words


class Text:
    """Cheap deterministic text: substrings of one long string of dictionary words, starting at
    a word boundary (so titles and subjects begin with a dictionary word). `for_table` gives a
    table its own random stream over the shared pool."""

    def __init__(self, rng: random.Random, words: list[str], size: int = 1 << 20):
        parts, starts, pos = [], [], 0
        while pos < size:
            w = rng.choice(words)
            starts.append(pos)
            parts.append(w)
            pos += len(w) + 1
        self.pool = " ".join(parts) + " " + " ".join(parts[:200])
        self.starts = starts

    def take(self, rng: random.Random, lo: int, hi: int) -> str:
        n = rng.randint(lo, hi)
        s = self.starts[rng.randrange(len(self.starts))]
        return self.pool[s : s + n].rstrip() or "rubbos"

    def for_table(self, rng: random.Random) -> Callable[[int, int], str]:
        return lambda lo, hi: self.take(rng, lo, hi)


def fmt(d: datetime) -> str:
    return d.strftime("%Y-%m-%d %H:%M:%S")


class Generator:
    """Rows of every table as tab-separated lines, table by table (deterministic)."""

    def __init__(self, scale: Scale, seed: int = 42, now: datetime | None = None):
        self.scale = scale
        self.seed = seed
        self.now = (now or datetime.now()).replace(microsecond=0)
        words = load_words()
        self.text = Text(random.Random(seed), words)
        sc = scale
        # Story times and comment counts first (own random streams), so ids can be laid out as
        # if stories had moved from `stories` to `old_stories` over time: old stories take the
        # lower ids, new stories follow (a story id names one story in either table, as
        # ViewStory assumes); likewise old comments, then comments.
        self.times = {
            "old_stories": self._story_times("old_stories", sc.new_days, sc.old_days, sc.old_stories_per_day),
            "stories": self._story_times("stories", 0, sc.new_days, sc.stories_per_day),
        }
        self.first_story_id = {"old_stories": 1, "stories": len(self.times["old_stories"]) + 1}
        limit = int(2 * sc.comments_per_story)
        self.thread_sizes = {}
        for table, story_table in (("old_comments", "old_stories"), ("comments", "stories")):
            r = self.rng(f"{table}:sizes")
            self.thread_sizes[table] = [r.randint(0, limit) for _ in self.times[story_table]]
        n_old_comments = sum(self.thread_sizes["old_comments"])
        self.first_comment_id = {"old_comments": 1, "comments": n_old_comments + 1}
        self.n_comments = {t: sum(s) for t, s in self.thread_sizes.items()}

    def rng(self, table: str) -> random.Random:
        """An independent stream per table, so tables can be generated alone."""
        return random.Random(f"{self.seed}:{table}")

    @property
    def n_users_total(self) -> int:
        return self.scale.users + self.scale.authors

    def author_ids(self) -> range:
        return range(self.scale.users + 1, self.scale.users + self.scale.authors + 1)

    def users(self) -> Iterator[str]:
        r = self.rng("users")
        for i in range(1, self.n_users_total + 1):
            if i <= self.scale.users:
                k, nick, access = i, f"user{i}", 0
            else:
                k = i - self.scale.users
                nick, access = f"author{k}", 1
            created = self.now - timedelta(seconds=r.randrange(3 * 365 * DAY))
            yield (
                f"{i}\tGreat{k}\tUser{k}\t{nick}\tpassword{k}\tGreat{k}.User{k}@rubbos.com\t"
                f"{r.randint(-5, 20)}\t{access}\t{fmt(created)}"
            )

    def _story_times(self, table: str, first_day: int, days: int, per_day: float) -> list[datetime]:
        """Times of stories over `days` days ending `first_day` days before now, oldest first."""
        r = self.rng(f"{table}:times")
        n = max(1, round(days * per_day))
        span = days * DAY
        end = self.now - timedelta(days=first_day)
        offsets = sorted((r.random() * span for _ in range(n)), reverse=True)
        return [end - timedelta(seconds=int(o) + 1) for o in offsets]

    def _stories(self, table: str) -> Iterator[str]:
        r = self.rng(table)
        t, sc = self.text.for_table(self.rng(f"{table}:text")), self.scale
        for i, d in enumerate(self.times[table], start=self.first_story_id[table]):
            yield f"{i}\t{t(10, 99)}\t{t(*sc.story_body)}\t{fmt(d)}\t{r.randint(1, sc.users)}\t{r.randrange(N_CATEGORIES)}"

    def stories(self) -> Iterator[str]:
        yield from self._stories("stories")

    def old_stories(self) -> Iterator[str]:
        yield from self._stories("old_stories")

    def _comments(self, table: str, story_table: str) -> Iterator[str]:
        """Comment trees: per story, each comment replies to the story (parent 0) or to an earlier
        comment of the same story; `childs` is counted before the rows are written."""
        r = self.rng(table)
        t, sc = self.text.for_table(self.rng(f"{table}:text")), self.scale
        next_id = self.first_comment_id[table]
        first_story = self.first_story_id[story_table]
        for k, (story_time, n) in enumerate(zip(self.times[story_table], self.thread_sizes[table])):
            if n == 0:
                continue
            story_id = first_story + k
            parents = [0] * n
            for j in range(1, n):
                if r.random() >= 0.35:
                    parents[j] = next_id + r.randrange(j)
            childs = [0] * n
            for p in parents:
                if p:
                    childs[p - next_id] += 1
            room = max(60, min(2 * DAY, int((self.now - story_time).total_seconds()) - 1))
            offsets = sorted(r.randrange(1, room) for _ in range(n))
            for j in range(n):
                writer = 0 if r.random() < 0.05 else r.randint(1, sc.users)
                rating = r.choices(RATINGS, RATING_WEIGHTS)[0]
                when = story_time + timedelta(seconds=offsets[j])
                yield (
                    f"{next_id + j}\t{writer}\t{story_id}\t{parents[j]}\t{childs[j]}\t{rating}\t{fmt(when)}\t"
                    f"{t(10, 99)}\t{t(*sc.comment_body)}"
                )
            next_id += n

    def comments(self) -> Iterator[str]:
        yield from self._comments("comments", "stories")

    def old_comments(self) -> Iterator[str]:
        yield from self._comments("old_comments", "old_stories")

    def submissions(self) -> Iterator[str]:
        r = self.rng("submissions")
        t, sc = self.text.for_table(self.rng("submissions:text")), self.scale
        for i in range(1, sc.submissions + 1):
            d = self.now - timedelta(seconds=r.randrange(1, 7 * DAY))
            yield f"{i}\t{t(10, 99)}\t{t(*sc.story_body)}\t{fmt(d)}\t{r.randint(1, sc.users)}\t{r.randrange(N_CATEGORIES)}"

    def moderator_log(self) -> Iterator[str]:
        """Moderations of (new) comments by authors."""
        r = self.rng("moderator_log")
        lo = self.first_comment_id["comments"]
        hi = lo + max(1, self.n_comments["comments"]) - 1
        authors = self.author_ids()
        for i in range(1, self.scale.moderator_log + 1):
            d = self.now - timedelta(seconds=r.randrange(1, 30 * DAY))
            yield f"{i}\t{r.choice(authors)}\t{r.randint(lo, hi)}\t{r.choice((-1, 0, 1))}\t{fmt(d)}"

    def tables(self) -> list[tuple[str, Callable[[], Iterator[str]]]]:
        """(table, row iterator) in load order (stories before their comments)."""
        return [
            ("users", self.users),
            ("stories", self.stories),
            ("old_stories", self.old_stories),
            ("submissions", self.submissions),
            ("comments", self.comments),
            ("old_comments", self.old_comments),
            ("moderator_log", self.moderator_log),
        ]


def chunks(rows: Iterator[str], size: int = 5000) -> Iterator[tuple[str, int]]:
    buf: list[str] = []
    for row in rows:
        buf.append(row)
        if len(buf) >= size:
            yield "\n".join(buf) + "\n", len(buf)
            buf = []
    if buf:
        yield "\n".join(buf) + "\n", len(buf)


@dataclass
class LoadReport(bulkload.LoadReport):
    """A RUBBoS load's report (`bulkload.LoadReport`) at the data preset `scale`."""

    scale: str = ""

    def lines(self) -> list[str]:
        out = self.table_lines(14)
        out.append(
            f"total {self.total_rows} rows in {self.seconds:.1f} s ({self.rows_per_s:.0f} rows/s, "
            f"{self.mb_per_s:.1f} MB/s of text, {self.method}); database size {self.db_size_bytes / 1e6:.1f} MB"
        )
        return out


def load(
    cfg: DbConfig,
    scale: Scale | str,
    seed: int = 42,
    now: datetime | None = None,
    progress: Callable[[str], None] | None = None,
) -> LoadReport:
    """Create the schema in `cfg.database` (dropping the tables first) and bulk-load generated
    rows; return rows per table, time, bytes and the database size."""
    if isinstance(scale, str):
        scale = scale_named(scale)
    say = progress or (lambda _m: None)
    bulkload.ensure_database(cfg)
    gen = Generator(scale, seed, now)
    tables_sql, index_sql = bulkload.schema_parts(HERE, cfg.dbms)
    t0 = time.perf_counter()
    rows: dict[str, int] = {}
    nbytes = 0
    if cfg.dbms == "postgresql":
        import psycopg

        with psycopg.connect(bulkload.pg_conninfo(cfg), autocommit=True) as conn:
            for stmt in tables_sql:
                conn.execute(stmt)
            method = "COPY"
            for table, it in gen.tables():
                cols = ", ".join(TABLE_COLUMNS[table])
                n = 0
                with conn.cursor() as cur, cur.copy(f"COPY {table} ({cols}) FROM STDIN") as cp:
                    for text, k in chunks(it()):
                        data = text.encode()
                        cp.write(data)
                        n += k
                        nbytes += len(data)
                rows[table] = n
                say(f"{table}: {n} rows")
            for table in TABLE_COLUMNS:
                conn.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), GREATEST((SELECT MAX(id) FROM {table}), 1))"
                )
            for stmt in index_sql:
                conn.execute(stmt)
            say("indexes built")
            conn.execute("VACUUM ANALYZE")
            rows["categories"] = conn.execute("SELECT COUNT(*) FROM categories").fetchone()[0]  # type: ignore[index]  # an aggregate: one row
            rows["users"] += 1  # the Anonymous Coward from the schema
            size = bulkload.postgres_size(conn)
    else:
        conn = bulkload.connect_mariadb(cfg)
        try:
            with conn.cursor() as cur:
                bulkload.begin_mariadb(cur, tables_sql)
                method = bulkload.LOCAL_INFILE
                with tempfile.TemporaryDirectory(prefix="rubbos-load-") as tmp:
                    for table, it in gen.tables():
                        path = Path(tmp) / f"{table}.tsv"
                        n = 0
                        with open(path, "w") as f:
                            for text, k in chunks(it()):
                                f.write(text)
                                n += k
                        nbytes += path.stat().st_size
                        method = bulkload.load_tsv_mariadb(cur, table, TABLE_COLUMNS[table], path, method, say)
                        rows[table] = n
                        path.unlink()
                        say(f"{table}: {n} rows")
                size = bulkload.finish_mariadb(cur, index_sql, TABLES, say)
                cur.execute("SELECT COUNT(*) FROM categories")
                rows["categories"] = cur.fetchone()[0]
                rows["users"] += 1  # the Anonymous Coward from the schema
        finally:
            conn.close()
    seconds = time.perf_counter() - t0
    ordered = {t: rows.get(t, 0) for t in TABLES}
    return LoadReport(cfg.dbms, ordered, seconds, nbytes, int(size), method, scale=scale.name)
