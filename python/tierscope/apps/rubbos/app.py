"""The RUBBoS bulletin board as a WSGI application: the 24 interactions of the digest §1 with the
original SQL shapes (including the N+1 nickname lookups and the recursive comment-tree queries of
ViewStory and ViewComment), the static pages and the logo.

Conventions (for the emulator and the tests):
- pages that find nothing (or refuse: wrong password, no author access) contain "Sorry";
- failures answer HTTP 500 with a page containing "ERROR" (no stack trace; it goes to the log);
- malformed or missing parameters answer HTTP 400 ("Bad request: ...");
- the request id comes from the `X-Request-Id` header (nginx sets it) or is made here; it is sent
  back in `X-Request-Id` and appended to every SQL statement (see dal.sqlcomment).

Fixed relative to the original 1.2.2 (digest §1 notes, §7): AcceptStory works (and deletes before
it inserts, so a submission is accepted once); reply queries select story_id and childs so the
whole tree is expanded; ViewComment uses the filter it is given; StoreComment checks that the
parent comment belongs to the story before it inserts (keeps `childs` consistent); ViewComment
takes the story of the chosen comment from the database.

Configuration: `create_app()` reads RUBBOS_* environment variables (see `AppConfig.from_env`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import parse_qs

from tierscope.apps import web
from tierscope.apps.dal import Database, DuplicateKey, like_prefix, like_prefix10
from tierscope.apps.rubbos import pages
from tierscope.apps.rubbos.events import EventRecorder
from tierscope.apps.rubbos.pages import url
from tierscope.apps.web import BadRequest, FormRequest, db_config_from_env, esc, fmt_date, now, sorry
from tierscope.contracts.dbms import DbConfig

log = logging.getLogger("tierscope.rubbos")

COMMENT_TABLES = ("comments", "old_comments")
MAX_BODY_BYTES = 256 * 1024
MAX_TEXT = 10000  # longest story/comment body accepted (TEXT columns hold 65535 bytes)
PAGE_SIZE_DEFAULT = 25  # the scripts' default when nbOfStories is absent
PAGE_SIZE_MAX = 200


@dataclass(frozen=True)
class AppConfig:
    db: DbConfig
    host_name: str = "app"
    events_dir: str | None = None
    allow_pause: bool = False
    pause_every_s: float = 0.0
    pause_ms: float = 0.0

    @classmethod
    def from_env(cls, env=os.environ) -> AppConfig:
        """RUBBOS_DBMS (postgresql|mariadb), RUBBOS_DB_HOST, RUBBOS_DB_PORT, RUBBOS_DB_USER,
        RUBBOS_DB_PASSWORD, RUBBOS_DB_NAME, RUBBOS_POOL_SIZE, RUBBOS_POOL_TIMEOUT_S,
        RUBBOS_HOST_NAME, RUBBOS_EVENTS_DIR, RUBBOS_ALLOW_PAUSE (1 enables /rubbos/admin/pause),
        RUBBOS_PAUSE_EVERY_S and RUBBOS_PAUSE_MS (periodic injected pauses)."""
        try:
            db = db_config_from_env(env, "RUBBOS", "rubbos")
            return cls(
                db=db,
                host_name=env.get("RUBBOS_HOST_NAME", "app"),
                events_dir=env.get("RUBBOS_EVENTS_DIR") or None,
                allow_pause=env.get("RUBBOS_ALLOW_PAUSE", "0") == "1",
                pause_every_s=float(env.get("RUBBOS_PAUSE_EVERY_S", "0")),
                pause_ms=float(env.get("RUBBOS_PAUSE_MS", "0")),
            )
        except ValueError as err:
            raise SystemExit(f"rubbos app: bad RUBBOS_* setting: {err}") from err


# --- request handling ------------------------------------------------------------------------


class Request(FormRequest):
    max_body_bytes = MAX_BODY_BYTES

    def __init__(self, environ: dict, request_id: str, db: Database):
        super().__init__(environ, request_id)
        self.db = db

    def comment_table(self) -> str:
        value = self.params.get("comment_table") or "comments"
        if value not in COMMENT_TABLES:
            raise BadRequest(f"parameter comment_table: expected comments or old_comments, got {value[:40]!r}")
        return value

    def paging(self) -> tuple[int, int]:
        page = self.int("page", 0, 0, 1_000_000)
        size = self.int("nbOfStories", PAGE_SIZE_DEFAULT, 1, PAGE_SIZE_MAX)
        assert page is not None and size is not None  # both have a default
        return page, size


# --- the interactions --------------------------------------------------------------------------
# Each takes (request, session) and returns (title, body html); HTTP 200.


def nickname(s, user_id) -> str:
    """The N+1 helper of the original: one query per displayed writer."""
    row = s.one("SELECT nickname FROM users WHERE id = %s", (user_id,))
    return row["nickname"] if row else "Unknown"


def authenticate(s, nick: str, password: str) -> tuple[int, int]:
    """(user id, access) for a nickname and password; (0, 0) = Anonymous Coward."""
    if not nick or not password:
        return 0, 0
    row = s.one("SELECT id, access FROM users WHERE nickname = %s AND password = %s", (nick, password))
    return (int(row["id"]), int(row["access"] or 0)) if row else (0, 0)


def story_list(s, rows, body_cut: int | None = None) -> str:
    out = []
    for r in rows:
        line = (
            f'<p><a href="{url("ViewStory", storyId=r["id"])}">{esc(r["title"])}</a> '
            f"by {esc(nickname(s, r['writer']))} on {fmt_date(r['date'])}</p>\n"
        )
        if body_cut is not None:
            body = r["body"] or ""
            line += f"<p>{esc(body[:body_cut])}{' ...' if len(body) > body_cut else ''}</p>\n"
        out.append(line)
    return "".join(out)


def paging_links(script: str, page: int, n: int, count: int, **params) -> str:
    out = ""
    if page > 0:
        out += f'<p><a href="{url(script, **params, page=page - 1, nbOfStories=n)}">Previous page</a></p>\n'
    if count >= n:
        out += f'<p><a href="{url(script, **params, page=page + 1, nbOfStories=n)}">Next page</a></p>\n'
    return out


def stories_of_the_day(req, s):
    rows = s.query("SELECT * FROM stories ORDER BY date DESC LIMIT 10")
    if not rows:
        return sorry("Stories of the day", "there is no story to show today.")
    return "Stories of the day", story_list(s, rows, body_cut=512)


def register_user(req, s):
    first = req.text("firstname", 20)
    last = req.text("lastname", 20)
    nick = req.text("nickname", 20)
    password = req.text("password", 20)
    email = req.text("email", 50)
    if s.one("SELECT * FROM users WHERE nickname = %s", (nick,)):
        return sorry("Register a new user", f"the nickname {nick} is already taken, please choose another one.")
    try:
        s.insert(
            "INSERT INTO users (firstname, lastname, nickname, password, email, rating, access, creation_date) "
            "VALUES (%s, %s, %s, %s, %s, 0, 0, %s)",
            (first, last, nick, password, email, now()),
        )
    except DuplicateKey:
        return sorry("Register a new user", f"the nickname {nick} is already taken, please choose another one.")
    row = s.one("SELECT * FROM users WHERE nickname = %s", (nick,))
    return "User registered", (
        f"<p>Your registration has been processed successfully.</p>\n"
        f"<p>Welcome {esc(row['nickname'])}: {esc(row['firstname'])} {esc(row['lastname'])}, "
        f"e-mail {esc(row['email'])}, user id {row['id']}, created {fmt_date(row['creation_date'])}.</p>\n"
    )


def browse_categories(req, s):
    rows = s.query("SELECT * FROM categories")
    if not rows:
        return sorry("Browse categories", "there is no category.")
    links = "".join(
        f'<p><a href="{url("BrowseStoriesByCategory", category=r["id"], categoryName=r["name"])}">{esc(r["name"])}</a></p>\n'
        for r in rows
    )
    return "Browse categories", links


def browse_stories_by_category(req, s):
    category = req.int("category", lo=0)
    name = req.text("categoryName", 50, required=False, default=f"category {category}")
    page, n = req.paging()
    rows = s.query(
        "SELECT * FROM stories WHERE category = %s ORDER BY date DESC LIMIT %s OFFSET %s",
        (category, n, page * n),
    )
    title = f"Stories in category {name}"
    if not rows:
        return sorry(title, "there is no story in this category.")
    head = f'<p><a href="{url("BrowseStoriesByCategory", category=category, categoryName=name)}">{esc(name)}</a></p>\n'
    return title, head + story_list(s, rows) + paging_links(
        "BrowseStoriesByCategory", page, n, len(rows), category=category, categoryName=name
    )


def older_stories(req, s):
    page, n = req.paging()
    if "daysAgo" in req.params:
        day = (datetime.now() - timedelta(days=req.int("daysAgo", lo=0, hi=100_000))).date()
    elif "day" in req.params or "month" in req.params or "year" in req.params:
        try:
            day = datetime(
                req.int("year", lo=1, hi=9999), req.int("month", lo=1, hi=12), req.int("day", lo=1, hi=31)
            ).date()
        except ValueError as err:
            raise BadRequest(f"parameters day/month/year: {err}") from err
    else:  # the form to pick a date
        form = (
            f'<form action="{pages.PREFIX}/OlderStories" method="get">\n'
            '<p>Day <input name="day" size="2"> Month <input name="month" size="2"> '
            'Year <input name="year" size="4"> <input type="hidden" name="nbOfStories" value="20">'
            '<input type="submit" value="Show"></p>\n</form>\n'
        )
        return "Older stories", form
    lo = datetime(day.year, day.month, day.day)
    hi = lo.replace(hour=23, minute=59, second=59)
    sql = "SELECT * FROM {t} WHERE date >= %s AND date <= %s ORDER BY date DESC LIMIT %s OFFSET %s"
    rows = s.query(sql.format(t="stories"), (lo, hi, n, page * n))
    if not rows:
        rows = s.query(sql.format(t="old_stories"), (lo, hi, n, page * n))
    title = f"Stories of {day.isoformat()}"
    if not rows:
        return sorry(title, f"there is no story for {day.isoformat()}.")
    return title, story_list(s, rows) + paging_links(
        "OlderStories", page, n, len(rows), day=day.day, month=day.month, year=day.year
    )


def rating_menu(s, table: str, story_id: int, comment_table: str, action: str, comment_id: int = 0) -> str:
    counts = s.query(
        f"SELECT rating, COUNT(rating) AS n FROM {table} WHERE story_id = %s GROUP BY rating ORDER BY rating",
        (story_id,),
    )
    by = {int(r["rating"]): int(r["n"]) for r in counts if r["rating"] is not None}
    opts = "".join(
        f'<option value="{k}">{k}: {sum(v for r, v in by.items() if r >= k)} comments</option>' for k in range(-1, 6)
    )
    return (
        f'<form action="{pages.PREFIX}/{action}" method="get">\n'
        f'<input type="hidden" name="comment_table" value="{comment_table}">'
        f'<input type="hidden" name="storyId" value="{story_id}">'
        f'<input type="hidden" name="commentId" value="{comment_id}">'
        f'<p>Filter <select name="filter">{opts}</select> Display '
        '<select name="display"><option value="0">Main threads</option>'
        '<option value="1" selected>Nested</option></select>'
        '<input type="submit" value="Refresh"></p>\n</form>\n'
    )


def comment_html(c: dict, writer: str, table: str, story_id: int, depth: int, full: bool) -> str:
    pad = "&nbsp;&nbsp;&nbsp;&nbsp;" * depth
    cid = c["id"]
    out = (
        f'<table width="100%"><tr><td>{pad}<b><a href="{url("ViewComment", comment_table=table, storyId=story_id, commentId=cid, filter=0, display=1)}">'
        f"{esc(c['subject'])}</a></b> by {esc(writer)} on {fmt_date(c['date'])}"
        + (f" (score {c['rating']})" if "rating" in c else "")
        + "</td></tr>\n"
    )
    if full and c.get("comment") is not None:
        out += f"<tr><td>{pad}{esc(c['comment'])}</td></tr>\n"
    out += (
        f'<tr><td>{pad}<a href="{url("PostComment", comment_table=table, storyId=story_id, parent=cid)}">Reply to this</a> '
        f'<a href="{url("ModerateComment", comment_table=table, commentId=cid)}">Moderate</a></td></tr></table>\n'
    )
    return out


def comment_thread(
    s, table: str, story_id: int, top: list[dict], filter_: int | None, full_replies: bool, expand: bool
) -> str:
    """The top comments of a story and (if `expand`) every reply below them, depth first: one
    nickname query per printed comment and one child query per comment that has replies."""
    out = []
    child_sql = (
        f"SELECT * FROM {table} WHERE parent = %s"
        if full_replies
        else f"SELECT id, subject, writer, date, story_id, childs FROM {table} WHERE parent = %s"
    )
    if filter_ is not None:
        child_sql += " AND rating >= %s"
    stack = [(c, 0) for c in reversed(top)]
    while stack:
        c, depth = stack.pop()
        out.append(
            comment_html(c, nickname(s, c["writer"]), table, story_id, depth, full=True if depth == 0 else full_replies)
        )
        if expand and (c.get("childs") or 0) > 0:
            params = (c["id"], filter_) if filter_ is not None else (c["id"],)
            replies = s.query(child_sql + " ORDER BY date", params)
            stack.extend((r, depth + 1) for r in reversed(replies))
    return "".join(out)


def view_story(req, s):
    story_id = req.int("storyId", lo=0)
    table = "comments"
    story = s.one("SELECT * FROM stories WHERE id = %s", (story_id,))
    if story is None:
        story = s.one("SELECT * FROM old_stories WHERE id = %s", (story_id,))
        table = "old_comments"
    if story is None:
        return sorry("View story", f"story {story_id} does not exist.")
    writer = nickname(s, story["writer"])
    body = (
        f"<p><b>{esc(story['title'])}</b></p>\n<p>Posted by {esc(writer)} on {fmt_date(story['date'])}</p>\n"
        f"<p>{esc(story['body'])}</p>\n"
        f'<p><a href="{url("PostComment", comment_table=table, storyId=story_id, parent=0)}">Post a comment on this story</a></p>\n'
    )
    body += rating_menu(s, table, story_id, table, "ViewComment")
    top = s.query(f"SELECT * FROM {table} WHERE story_id = %s AND parent = 0 AND rating >= 0", (story_id,))
    body += comment_thread(s, table, story_id, top, None, full_replies=False, expand=True)
    return story["title"], body


def post_comment(req, s):
    table = req.comment_table()
    story_id = req.int("storyId", lo=0)
    parent = req.int("parent", 0, lo=0)
    return "Post a comment", (
        f'<form action="{pages.PREFIX}/StoreComment" method="post">\n'
        f'<input type="hidden" name="comment_table" value="{table}">'
        f'<input type="hidden" name="storyId" value="{story_id}">'
        f'<input type="hidden" name="parent" value="{parent}">\n'
        '<p>Nickname <input type="text" name="nickname" maxlength="20"> '
        'Password <input type="password" name="password" maxlength="20"></p>\n'
        '<p>Subject <input type="text" name="subject" maxlength="100"></p>\n'
        '<p><textarea name="body" rows="10" cols="70"></textarea></p>\n'
        '<p><input type="submit" value="Post your comment now!"></p>\n</form>\n'
    )


def store_comment(req, s):
    table = req.comment_table()
    story_id = req.int("storyId", lo=0)
    parent = req.int("parent", 0, lo=0)
    nick = req.text("nickname", 100, required=False)
    password = req.text("password", 100, required=False)
    subject = req.text("subject", 100)
    body = req.text("body", MAX_TEXT)
    uid, _ = authenticate(s, nick, password)
    if parent != 0:
        p = s.one(f"SELECT story_id FROM {table} WHERE id = %s", (parent,))
        if p is None or int(p["story_id"]) != story_id:
            return sorry("Store comment", f"comment {parent} of story {story_id} does not exist.")
    cid = s.insert(
        f"INSERT INTO {table} (writer, story_id, parent, childs, rating, date, subject, comment) "
        "VALUES (%s, %s, %s, 0, 0, %s, %s, %s)",
        (uid, story_id, parent, now(), subject, body),
    )
    if parent != 0:
        s.execute(f"UPDATE {table} SET childs = childs + 1 WHERE id = %s", (parent,))
    return "Comment stored", (
        f"<p>Your comment has been successfully stored in the {table} database table (id {cid}).</p>\n"
        f'<p><a href="{url("ViewStory", storyId=story_id)}">Back to the story</a></p>\n'
    )


def view_comment(req, s):
    table = req.comment_table()
    comment_id = req.int("commentId", 0, lo=0)
    filter_ = req.int("filter", 0, lo=-1, hi=5)
    display = req.int("display", 1, lo=0, hi=1)
    if comment_id != 0:
        row = s.one(f"SELECT parent, story_id FROM {table} WHERE id = %s", (comment_id,))
        if row is None:
            return sorry("View comment", f"comment {comment_id} does not exist in {table}.")
        story_id = int(row["story_id"])
    else:
        story_id = req.int("storyId", lo=0)
    body = rating_menu(s, table, story_id, table, "ViewComment", comment_id)
    top = s.query(f"SELECT * FROM {table} WHERE story_id = %s AND parent = 0 AND rating >= %s", (story_id, filter_))
    if not top:
        return sorry("View comment", f"there is no comment for story {story_id} at this filter level.")
    body += comment_thread(s, table, story_id, top, filter_, full_replies=True, expand=display > 0)
    return "View comments", body


def moderate_comment(req, s):
    table = req.comment_table()
    comment_id = req.int("commentId", lo=0)
    c = s.one(f"SELECT * FROM {table} WHERE id = %s", (comment_id,))
    if c is None:
        return sorry("Moderate comment", f"comment {comment_id} does not exist in {table}.")
    writer = nickname(s, c["writer"])
    return "Moderate a comment", (
        f"<p><b>{esc(c['subject'])}</b> by {esc(writer)} on {fmt_date(c['date'])} (score {c['rating']})</p>\n"
        f"<p>{esc(c['comment'])}</p>\n"
        f'<form action="{pages.PREFIX}/StoreModeratorLog" method="post">\n'
        f'<input type="hidden" name="comment_table" value="{table}">'
        f'<input type="hidden" name="commentId" value="{comment_id}">\n'
        '<p>Nickname <input type="text" name="nickname" maxlength="20"> '
        'Password <input type="password" name="password" maxlength="20"></p>\n'
        '<p>Rating <select name="rating"><option value="-1">-1: Offtopic</option>'
        '<option value="0" selected>0: Not rated</option><option value="1">1: Interesting</option></select>'
        '<input type="submit" value="Moderate this comment now!"></p>\n</form>\n'
    )


def store_moderator_log(req, s):
    table = req.comment_table()
    comment_id = req.int("commentId", lo=0)
    rating = req.int("rating", lo=-1, hi=1)
    nick = req.text("nickname", 100, required=False)
    password = req.text("password", 100, required=False)
    uid, access = authenticate(s, nick, password)
    if uid == 0 or access == 0:
        return sorry("Moderation", "but this feature is only accessible by users with an author access.")
    c = s.one(f"SELECT writer, rating FROM {table} WHERE id = %s", (comment_id,))
    if c is None:
        return sorry("Moderation", f"comment {comment_id} does not exist in {table}.")
    current = int(c["rating"] or 0)
    if (current == -1 and rating == -1) or (current == 5 and rating == 1):
        return "Moderation", f"<p>Comment rating is already at its limit ({current}); nothing changed.</p>\n"
    if rating != 0:
        s.execute("UPDATE users SET rating = rating + %s WHERE id = %s", (rating, c["writer"]))
        s.execute(f"UPDATE {table} SET rating = rating + %s WHERE id = %s", (rating, comment_id))
    user = s.one("SELECT rating FROM users WHERE id = %s", (c["writer"],))
    comment = s.one(f"SELECT rating FROM {table} WHERE id = %s", (comment_id,))
    s.insert(
        "INSERT INTO moderator_log (moderator_id, comment_id, rating, date) VALUES (%s, %s, %s, %s)",
        (uid, comment_id, rating, now()),
    )
    return "Moderation", (
        f"<p>Your moderation has been successfully stored.</p>\n"
        f"<p>New comment rating {comment['rating'] if comment else '?'}, "
        f"new user rating {user['rating'] if user else '?'}.</p>\n"
    )


def submit_story(req, s):
    rows = s.query("SELECT * FROM categories")
    opts = "".join(f'<option value="{r["id"]}">{esc(r["name"])}</option>' for r in rows)
    return "Submit a story", (
        f'<form action="{pages.PREFIX}/StoreStory" method="post">\n'
        '<p>Nickname <input type="text" name="nickname" maxlength="20"> '
        'Password <input type="password" name="password" maxlength="20"></p>\n'
        '<p>Title <input type="text" name="title" maxlength="100"></p>\n'
        f'<p>Category <select name="category">{opts}</select></p>\n'
        '<p><textarea name="body" rows="20" cols="80"></textarea></p>\n'
        '<p><input type="submit" value="Submit this story now!"></p>\n</form>\n'
    )


def store_story(req, s):
    nick = req.text("nickname", 100, required=False)
    password = req.text("password", 100, required=False)
    title = req.text("title", 100)
    body = req.text("body", MAX_TEXT)
    category = req.int("category", lo=0)
    uid, access = authenticate(s, nick, password)
    target = "stories" if access != 0 else "submissions"
    sid = s.insert(
        f"INSERT INTO {target} (title, body, date, writer, category) VALUES (%s, %s, %s, %s, %s)",
        (title, body, now(), uid, category),
    )
    return "Story submitted", (
        f"<p>Your story has been successfully stored in the {target} database table (id {sid}).</p>\n"
    )


def search(req, s):
    if not req.params.get("type"):
        return "Search", pages.search_form()
    kind = req.int("type", lo=0, hi=2)
    word = req.text("search", 100)
    page, n = req.paging()
    pattern = like_prefix(word)
    pg = s.db.dbms == "postgresql"
    p10 = like_prefix10(word)
    if kind == 0:
        sql = "SELECT id, title, date, writer FROM {t} WHERE title LIKE %s"
        sql += " AND left(title, 10) LIKE %s" if pg else ""
        sql += " ORDER BY date DESC LIMIT %s OFFSET %s"
        params = (pattern, p10, n, page * n) if pg else (pattern, n, page * n)
        rows = s.query(sql.format(t="stories"), params)
        if not rows:
            rows = s.query(sql.format(t="old_stories"), params)
        title = f"Stories with a title starting with {word}"
    elif kind == 1:
        extra = " AND left(subject, 10) LIKE %s" if pg else ""
        table = "comments"
        rows = s.query(
            "SELECT id, story_id, subject, writer, date FROM comments WHERE id IN "
            f"(SELECT MAX(id) FROM comments WHERE subject LIKE %s{extra} GROUP BY story_id) "
            "ORDER BY date DESC LIMIT %s OFFSET %s",
            (pattern, p10, n, page * n) if pg else (pattern, n, page * n),
        )
        if not rows:
            table = "old_comments"
            rows = s.query(
                f"SELECT id, story_id, subject, writer, date FROM old_comments WHERE subject LIKE %s{extra} "
                "ORDER BY date DESC LIMIT %s OFFSET %s",
                (pattern, p10, n, page * n) if pg else (pattern, n, page * n),
            )
        title = f"Comments with a subject starting with {word}"
    else:
        sql = (
            "SELECT {t}.id, {t}.title, {t}.date, {t}.writer FROM {t}, users "
            "WHERE {t}.writer = users.id AND users.nickname LIKE %s ORDER BY {t}.date DESC LIMIT %s OFFSET %s"
        )
        rows = s.query(sql.format(t="stories"), (pattern, n, page * n))
        if not rows:
            rows = s.query(sql.format(t="old_stories"), (pattern, n, page * n))
        title = f"Stories by users whose nickname starts with {word}"
    if not rows:
        return sorry(title, f"nothing matches {word}.")
    if kind == 1:
        body = "".join(
            f'<p><a href="{url("ViewComment", comment_table=table, storyId=r["story_id"], commentId=r["id"], filter=0, display=0)}">'
            f"{esc(r['subject'])}</a> by {esc(nickname(s, r['writer']))} on {fmt_date(r['date'])}</p>\n"
            for r in rows
        )
    else:
        body = story_list(s, rows)
    return title, body + paging_links("Search", page, n, len(rows), type=kind, search=word)


def author(req, s):
    nick = req.text("nickname", 100, required=False)
    password = req.text("password", 100, required=False)
    uid, access = authenticate(s, nick, password)
    if uid == 0 or access == 0:
        return sorry("Author", "your nickname or password is wrong, or you have no author access.")
    return "Author tasks", f'<p><a href="{url("ReviewStories", authorId=uid)}">Review submitted stories</a></p>\n'


def review_stories(req, s):
    rows = s.query("SELECT * FROM submissions ORDER BY date DESC LIMIT 10")
    if not rows:
        return sorry("Review stories", "there is no submitted story to review.")
    out = []
    for r in rows:
        out.append(
            f"<p><b>{esc(r['title'])}</b> by {esc(nickname(s, r['writer'] or 0))} on {fmt_date(r['date'])} "
            f'<a href="{url("AcceptStory", storyId=r["id"])}">Accept</a> '
            f'<a href="{url("RejectStory", storyId=r["id"])}">Reject</a></p>\n'
            f"<p>{esc((r['body'] or '')[:512])}</p>\n"
        )
    return "Submitted stories", "".join(out)


def accept_story(req, s):
    sid = req.int("storyId", lo=0)
    sub = s.one("SELECT * FROM submissions WHERE id = %s", (sid,))
    if sub is None or s.execute("DELETE FROM submissions WHERE id = %s", (sid,)) != 1:
        return sorry("Accept story", f"submission {sid} does not exist (any more).")
    new_id = s.insert(
        "INSERT INTO stories (title, body, date, writer, category) VALUES (%s, %s, %s, %s, %s)",
        (sub["title"], sub["body"], sub["date"], sub["writer"] or 0, sub["category"]),
    )
    return "Story accepted", f"<p>The story has been successfully moved to the stories table (id {new_id}).</p>\n"


def reject_story(req, s):
    sid = req.int("storyId", lo=0)
    if s.one("SELECT id FROM submissions WHERE id = %s", (sid,)) is None:
        return sorry("Reject story", f"submission {sid} does not exist (any more).")
    if s.execute("DELETE FROM submissions WHERE id = %s", (sid,)) != 1:
        return sorry("Reject story", f"submission {sid} does not exist (any more).")
    return "Story rejected", "<p>The story has been successfully removed from the submissions.</p>\n"


#: script name -> (handler, uses the database)
INTERACTIONS = {
    "StoriesOfTheDay": (stories_of_the_day, True),
    "RegisterUser": (register_user, True),
    "BrowseCategories": (browse_categories, True),
    "BrowseStoriesByCategory": (browse_stories_by_category, True),
    "OlderStories": (older_stories, True),
    "ViewStory": (view_story, True),
    "PostComment": (post_comment, False),
    "StoreComment": (store_comment, True),
    "ViewComment": (view_comment, True),
    "ModerateComment": (moderate_comment, True),
    "StoreModeratorLog": (store_moderator_log, True),
    "SubmitStory": (submit_story, True),
    "StoreStory": (store_story, True),
    "Search": (search, True),
    "Author": (author, True),
    "ReviewStories": (review_stories, True),
    "AcceptStory": (accept_story, True),
    "RejectStory": (reject_story, True),
}


class RubbosApp:
    """The WSGI application."""

    def __init__(self, config: AppConfig):
        self.config = config
        self.db = Database(config.db)
        self.static = {f"{pages.PREFIX}/{k}": v.encode() for k, v in pages.static_pages().items()}
        self.logo = pages.logo_bytes()
        self.events = None
        if config.events_dir:
            self.events = EventRecorder(config.events_dir, config.host_name)
            if config.pause_every_s > 0 and config.pause_ms > 0:
                threading.Thread(target=self._periodic_pauses, name="pauses", daemon=True).start()

    def _periodic_pauses(self) -> None:
        assert self.events is not None  # started only with the recorder
        while True:
            time.sleep(self.config.pause_every_s)
            self.events.pause(self.config.pause_ms)

    def __call__(self, environ, start_response):
        return web.serve(environ, start_response, self._dispatch)

    def _dispatch(self, environ, path, method, rid, t0):
        if path in ("/", pages.PREFIX, pages.PREFIX + "/"):
            path = pages.PREFIX + "/index.html"
        if path in self.static:
            return "200 OK", web.HTML, self.static[path]
        if path == pages.LOGO:
            return "200 OK", "image/png", self.logo
        if path == pages.PREFIX + "/health":
            return web.health(self.db, rid)
        if path == pages.PREFIX + "/admin/pause":
            return self._admin_pause(environ)
        if not path.startswith(pages.PREFIX + "/"):
            return "404 Not Found", web.HTML, pages.page("Not found", "<p>No such page.</p>\n").encode()
        script = path[len(pages.PREFIX) + 1 :]
        entry = INTERACTIONS.get(script)
        if entry is None:
            return "404 Not Found", web.HTML, pages.page("Not found", f"<p>No such page: {esc(script)}</p>\n").encode()
        if method not in ("GET", "POST", "HEAD"):
            return (
                "405 Method Not Allowed",
                web.HTML,
                pages.page("Bad request", "<p>Method not allowed.</p>\n").encode(),
            )
        handler, _ = entry
        try:
            req = Request(environ, rid, self.db)
            with self.db.session(rid) as s:
                title, content = handler(req, s)
            text = pages.page(title, content, (time.perf_counter() - t0) * 1000)
            return "200 OK", web.HTML, text.encode()
        except Exception as err:  # 400 for a malformed request; a failure logged, answered without its trace
            return web.failure(err, rid, script, pages.page, log)

    def _admin_pause(self, environ):
        if not (self.config.allow_pause and self.events):
            return (
                "403 Forbidden",
                "text/plain",
                b"pauses are disabled (RUBBOS_ALLOW_PAUSE=1 and RUBBOS_EVENTS_DIR enable them)\n",
            )
        qs = parse_qs(environ.get("QUERY_STRING", ""))
        try:
            ms = float(qs.get("ms", ["100"])[0])
            if not 0 < ms <= 60_000:
                raise ValueError
        except ValueError:
            return "400 Bad Request", "text/plain", b"Bad request: ms must be a number in (0, 60000]\n"
        self.events.pause(ms)
        return "200 OK", "text/plain", f"paused {ms:g} ms pid {os.getpid()}\n".encode()


def create_app(config: AppConfig | None = None) -> RubbosApp:
    """The WSGI application (gunicorn: `tierscope.apps.rubbos.app:create_app()`)."""
    web.log_to_stderr()
    return RubbosApp(config or AppConfig.from_env())
