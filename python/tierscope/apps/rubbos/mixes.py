"""The RUBBoS workload mixes: the transition tables of the digest (§2.5–2.8) turned into
tierscope workload files (docs/workload.md), and a simulator of the emulator's walk to check the
page mix they produce (§2.5, §2.9).

Orientation: the original files are column-oriented (each column is the "from" state); the digest
lists them per from-state, and tierscope's files are row-oriented (`[transitions.<name>]` maps a
page to its outgoing distribution), so the rows below are the digest's lists as written.
Rows whose original probabilities sum above 1 are cut off in the original's destination order
(the emulator never reaches the later destinations: `effective`); rows below 1 keep the slack as
an implicit self-loop (the workload format does the same).

Where the digest elides a row ("…"), the row is completed with the small leak the same table uses
in its other rows; those rows are unreachable or rare, and the tests check that the resulting mix
matches the digest's derived mix.

Run `python -m tierscope.apps.rubbos.mixes` to rewrite the files in workloads/.
"""

from __future__ import annotations

import random
import tomllib
from collections import Counter
from pathlib import Path

WORKLOAD_DIR = Path(__file__).parent / "workloads"

#: state short names in the original's row/column order (0..23), then the pseudo-states
SHORT = [
    "SotD",
    "Reg",
    "RegUser",
    "Browse",
    "BrCat",
    "BrStCat",
    "Older",
    "ViewStory",
    "PostCom",
    "StoreCom",
    "ViewCom",
    "ModCom",
    "StoreModLog",
    "SubmitSt",
    "StoreSt",
    "Search",
    "SrchStories",
    "SrchComments",
    "SrchUsers",
    "AuthLogin",
    "AuthTask",
    "Review",
    "Accept",
    "Reject",
    "BACK",
    "END",
]
#: page (state) names used in the workload files
PAGE = {
    "SotD": "StoriesOfTheDay",
    "Reg": "Register",
    "RegUser": "RegisterUser",
    "Browse": "Browse",
    "BrCat": "BrowseCategories",
    "BrStCat": "BrowseStoriesInCategory",
    "Older": "OlderStories",
    "ViewStory": "ViewStory",
    "PostCom": "PostComment",
    "StoreCom": "StoreComment",
    "ViewCom": "ViewComment",
    "ModCom": "ModerateComment",
    "StoreModLog": "StoreModerateLog",
    "SubmitSt": "SubmitStory",
    "StoreSt": "StoreStory",
    "Search": "Search",
    "SrchStories": "SearchInStories",
    "SrchComments": "SearchInComments",
    "SrchUsers": "SearchInUsers",
    "AuthLogin": "AuthorLogin",
    "AuthTask": "AuthorTasks",
    "Review": "ReviewStories",
    "Accept": "AcceptStory",
    "Reject": "RejectStory",
    "BACK": "BACK",
    "END": "END",
}
SHORT_OF = {v: k for k, v in PAGE.items()}
WRITES = {"RegisterUser", "StoreComment", "StoreModerateLog", "StoreStory", "AcceptStory", "RejectStory"}
SEARCH_PAGES = {"Search", "SearchInStories", "SearchInComments", "SearchInUsers"}

Row = dict[str, float]


def effective(row: Row) -> Row:
    """The probabilities the original emulator realises: destinations walked in row order
    0..25, cumulative probability capped at 1 (later destinations are cut off)."""
    out, total = {}, 0.0
    for dest in SHORT:
        p = row.get(dest, 0.0)
        if p <= 0:
            continue
        p = min(p, 1.0 - total)
        if p > 1e-12:
            out[dest] = round(p, 6)
            total += p
    return out


def _with(leak: Row, **core: float) -> Row:
    row = dict(leak)
    for k, v in core.items():
        row[k] = row.get(k, 0.0) + v
    return row


# --- browse-only (§2.5) ---------------------------------------------------------------------
def browse_only() -> dict[str, Row]:
    def srch(target: str, self_: str) -> Row:
        return {
            "SotD": 0.10,
            "Browse": 0.005,
            target: 0.49,
            "Search": 0.005,
            self_: 0.30,
            "END": 0.10,
        }

    return {
        "SotD": {"Browse": 0.15, "ViewStory": 0.60, "Search": 0.15, "END": 0.10},
        "Browse": {"SotD": 0.19, "BrCat": 0.40, "Older": 0.40, "Search": 0.005},
        "BrCat": {"Browse": 0.005, "BrStCat": 0.99, "Search": 0.005},
        "BrStCat": {
            "SotD": 0.10,
            "Browse": 0.005,
            "BrStCat": 0.30,
            "ViewStory": 0.44,
            "Search": 0.005,
            "BACK": 0.10,
            "END": 0.05,
        },
        "Older": {"SotD": 0.10, "Browse": 0.005, "Older": 0.35, "ViewStory": 0.49, "Search": 0.005, "END": 0.05},
        "ViewStory": {"SotD": 0.10, "Browse": 0.005, "ViewCom": 0.49, "Search": 0.005, "BACK": 0.30, "END": 0.10},
        "ViewCom": {"SotD": 0.10, "Browse": 0.005, "ViewCom": 0.30, "Search": 0.005, "BACK": 0.50, "END": 0.10},
        "Search": {"SotD": 0.10, "Browse": 0.005, "SrchStories": 0.50, "SrchComments": 0.30, "SrchUsers": 0.09},
        "SrchStories": srch("ViewStory", "SrchStories"),
        "SrchComments": srch("ViewCom", "SrchComments"),
        "SrchUsers": srch("ViewStory", "SrchUsers"),
    }


# --- read/write, user sessions (§2.6) --------------------------------------------------------
USER_LEAK: Row = {"Reg": 0.001, "Browse": 0.004, "SubmitSt": 0.002, "Search": 0.003}


def user_default() -> dict[str, Row]:
    after_write = {"SotD": 0.20, "Reg": 0.07, "Browse": 0.28, "SubmitSt": 0.14, "Search": 0.21, "END": 0.10}
    srch = lambda target, self_: _with(USER_LEAK, SotD=0.10, END=0.10, **{target: 0.49, self_: 0.30})  # noqa: E731
    after_review = {
        "SotD": 0.20,
        "Reg": 0.04,
        "Browse": 0.16,
        "SubmitSt": 0.08,
        "Search": 0.12,
        "BACK": 0.35,
        "END": 0.05,
    }
    return {
        "SotD": {"Reg": 0.03, "Browse": 0.12, "ViewStory": 0.60, "SubmitSt": 0.06, "Search": 0.09, "END": 0.10},
        "Reg": {"RegUser": 0.99, "Browse": 0.004, "SubmitSt": 0.002, "Search": 0.003},
        "RegUser": dict(after_write),
        "Browse": _with(USER_LEAK, SotD=0.19, BrCat=0.40, Older=0.40),
        "BrCat": _with(USER_LEAK, BrStCat=0.99),
        "BrStCat": _with(USER_LEAK, SotD=0.10, BrStCat=0.30, ViewStory=0.44, BACK=0.10, END=0.05),
        "Older": _with(USER_LEAK, SotD=0.10, Older=0.35, ViewStory=0.49, END=0.05),
        "ViewStory": _with(USER_LEAK, SotD=0.10, PostCom=0.25, ViewCom=0.39, BACK=0.15, END=0.10),
        "PostCom": _with(USER_LEAK, StoreCom=0.99),
        "StoreCom": dict(after_write),
        "ViewCom": _with(USER_LEAK, SotD=0.10, PostCom=0.25, ViewCom=0.34, BACK=0.20, END=0.10),
        "ModCom": _with(USER_LEAK, SotD=0.01, StoreModLog=0.98),
        "StoreModLog": dict(after_write),
        # Σ 1.14 in the original: StoreSt is cut to .845 by `effective`
        "SubmitSt": {"SotD": 0.01, "Reg": 0.001, "Browse": 0.004, "SubmitSt": 0.14, "StoreSt": 0.98, "Search": 0.003},
        "StoreSt": dict(after_write),
        "Search": {
            "SotD": 0.10,
            "Reg": 0.001,
            "Browse": 0.004,
            "SubmitSt": 0.002,
            "SrchStories": 0.50,
            "SrchComments": 0.30,
            "SrchUsers": 0.09,
        },
        "SrchStories": srch("ViewStory", "SrchStories"),
        "SrchComments": srch("ViewCom", "SrchComments"),
        "SrchUsers": srch("ViewStory", "SrchUsers"),
        "AuthLogin": _with(USER_LEAK, SotD=0.01, AuthTask=0.98),
        "AuthTask": _with(USER_LEAK, SotD=0.01, Review=0.98),
        "Review": _with(USER_LEAK, SotD=0.10, Accept=0.50, Reject=0.29, END=0.10),
        "Accept": dict(after_review),
        "Reject": dict(after_review),
    }


# --- read/write, author sessions (§2.7) ------------------------------------------------------
AUTHOR_LEAK: Row = {"Browse": 0.003, "SubmitSt": 0.001, "Search": 0.002, "AuthLogin": 0.004}


def author_default() -> dict[str, Row]:
    after_write = {"SotD": 0.20, "Browse": 0.21, "SubmitSt": 0.07, "Search": 0.14, "AuthLogin": 0.28, "END": 0.10}
    srch = lambda target, self_: _with(AUTHOR_LEAK, SotD=0.10, END=0.10, **{target: 0.49, self_: 0.30})  # noqa: E731
    after_review = {
        "SotD": 0.20,
        "Browse": 0.12,
        "SubmitSt": 0.04,
        "Search": 0.08,
        "AuthLogin": 0.16,
        "BACK": 0.35,
        "END": 0.05,
    }
    return {
        "SotD": {"Browse": 0.09, "ViewStory": 0.60, "SubmitSt": 0.03, "Search": 0.06, "AuthLogin": 0.12, "END": 0.10},
        "Reg": _with(AUTHOR_LEAK, RegUser=0.99),
        "RegUser": dict(after_write),
        "Browse": _with(AUTHOR_LEAK, SotD=0.19, BrCat=0.40, Older=0.40),
        "BrCat": _with(AUTHOR_LEAK, BrStCat=0.99),
        "BrStCat": _with(AUTHOR_LEAK, SotD=0.10, BrStCat=0.30, ViewStory=0.44, BACK=0.10, END=0.05),
        "Older": _with(AUTHOR_LEAK, SotD=0.10, Older=0.35, ViewStory=0.49, END=0.05),
        "ViewStory": _with(AUTHOR_LEAK, SotD=0.10, PostCom=0.10, ViewCom=0.29, ModCom=0.25, BACK=0.15, END=0.10),
        "PostCom": _with(AUTHOR_LEAK, StoreCom=0.99),
        "StoreCom": dict(after_write),
        "ViewCom": _with(AUTHOR_LEAK, SotD=0.10, PostCom=0.10, ViewCom=0.24, ModCom=0.25, BACK=0.20, END=0.10),
        "ModCom": _with(AUTHOR_LEAK, SotD=0.01, StoreModLog=0.98),
        "StoreModLog": dict(after_write),
        # self .07; StoreSt .98 is cut by `effective`
        "SubmitSt": {
            "SotD": 0.01,
            "Browse": 0.003,
            "SubmitSt": 0.07,
            "StoreSt": 0.98,
            "Search": 0.002,
            "AuthLogin": 0.004,
        },
        "StoreSt": dict(after_write),
        "Search": _with(
            {"Browse": 0.003, "SubmitSt": 0.001, "AuthLogin": 0.004},
            SotD=0.10,
            SrchStories=0.50,
            SrchComments=0.30,
            SrchUsers=0.09,
        ),
        "SrchStories": srch("ViewStory", "SrchStories"),
        "SrchComments": srch("ViewCom", "SrchComments"),
        "SrchUsers": srch("ViewStory", "SrchUsers"),
        "AuthLogin": _with(AUTHOR_LEAK, SotD=0.01, AuthTask=0.98),
        "AuthTask": _with(AUTHOR_LEAK, SotD=0.01, Review=0.98),
        "Review": _with(AUTHOR_LEAK, SotD=0.10, Accept=0.50, Reject=0.29, END=0.10),
        "Accept": dict(after_review),
        "Reject": dict(after_review),
    }


# --- the "no search" variants (§2.8) ---------------------------------------------------------
def no_search(table: dict[str, Row], overrides: dict[str, Row]) -> dict[str, Row]:
    """Search unreachable: rows given in `overrides` replace the originals (the digest's numbers);
    in every other row the probability of going to Search moves to StoriesOfTheDay."""
    out = {}
    for src, row in table.items():
        if PAGE[src] in SEARCH_PAGES:
            continue
        if src in overrides:
            out[src] = dict(overrides[src])
            continue
        row = dict(row)
        moved = row.pop("Search", 0.0)
        if moved:
            row["SotD"] = row.get("SotD", 0.0) + moved
        out[src] = row
    return out


def browse_only_no_search() -> dict[str, Row]:
    return no_search(browse_only(), {"SotD": {"Browse": 0.30, "ViewStory": 0.60, "END": 0.10}})


def user_default_no_search() -> dict[str, Row]:
    aw = {"SotD": 0.40, "Reg": 0.075, "Browse": 0.30, "SubmitSt": 0.125, "END": 0.10}
    ar = {"SotD": 0.37, "Reg": 0.04, "Browse": 0.16, "SubmitSt": 0.08, "BACK": 0.30, "END": 0.05}
    return no_search(
        user_default(),
        {
            "SotD": {"Reg": 0.045, "Browse": 0.18, "ViewStory": 0.60, "SubmitSt": 0.075, "END": 0.10},
            "RegUser": aw,
            "StoreCom": aw,
            "StoreModLog": aw,
            "StoreSt": aw,
            "Accept": ar,
            "Reject": ar,
        },
    )


def author_default_no_search() -> dict[str, Row]:
    aw = {"SotD": 0.34, "Browse": 0.21, "SubmitSt": 0.07, "AuthLogin": 0.28, "END": 0.10}
    ar = {"SotD": 0.33, "Browse": 0.12, "SubmitSt": 0.04, "AuthLogin": 0.16, "BACK": 0.30, "END": 0.05}
    return no_search(
        author_default(),
        {
            "SotD": {"Browse": 0.15, "ViewStory": 0.60, "SubmitSt": 0.03, "AuthLogin": 0.12, "END": 0.10},
            "RegUser": aw,
            "StoreCom": aw,
            "StoreModLog": aw,
            "StoreSt": aw,
            "Accept": ar,
            "Reject": ar,
        },
    )


def rows_by_page(table: dict[str, Row]) -> dict[str, Row]:
    """Row-oriented table with page names and effective probabilities."""
    return {PAGE[src]: {PAGE[d]: p for d, p in effective(row).items()} for src, row in table.items()}


# --- pages: URLs and the emulator's parameter rules (§2.4) -------------------------------------
def _older_days() -> list[str]:
    """OlderStories date rule as days before today (u = 0..99): 1 day 20 %, 2..6 days 10 % each,
    7 days 26 %, and 4 % a random older date (here: 4 fixed days spread over the old stories)."""
    days = ["1"] * 20 + [str(d) for d in range(2, 7) for _ in range(10)] + ["7"] * 26
    return days + ["90", "270", "450", "630"]


def page_specs() -> dict[str, dict]:
    """Page name -> {method, url, params, form} (TOML-ready dicts)."""
    back = "back"
    zero = {"choice": ["0"]}
    ex = lambda rx, pick="first", otherwise=back: {"extract": rx, "pick": pick, "otherwise": otherwise}  # noqa: E731
    login = {"nickname": "{who}{k}", "password": "password{k}"}
    text = lambda lo, hi: {"text": [lo, hi]}  # noqa: E731
    search = lambda kind, word: {  # noqa: E731
        "url": f"/rubbos/Search?type={kind}&search={{search}}&page={{page}}&nbOfStories=20",
        "params": {"search": word, "page": ex(rf'Search\?type={kind}&search=[^&"]*&page=(\d+)', "random", zero)},
    }
    return {
        "StoriesOfTheDay": {"url": "/rubbos/StoriesOfTheDay"},
        "Register": {"url": "/rubbos/register.html"},
        "RegisterUser": {
            "method": "POST",
            "url": "/rubbos/RegisterUser",
            "form": {
                "firstname": "Great{reg}",
                "lastname": "User{reg}",
                "nickname": "user{reg}",
                "password": "password{reg}",
                "email": "Great{reg}.User{reg}@rubbos.com",
            },
        },
        "Browse": {"url": "/rubbos/browse.html"},
        "BrowseCategories": {"url": "/rubbos/BrowseCategories"},
        "BrowseStoriesInCategory": {
            "url": "/rubbos/BrowseStoriesByCategory?category={category}&page={page}&nbOfStories=20",
            "params": {
                "category": ex(r"BrowseStoriesByCategory\?category=(\d+)", "random"),
                "page": ex(r'BrowseStoriesByCategory\?category=\d+&categoryName=[^&"]*&page=(\d+)', "random", zero),
            },
        },
        "OlderStories": {
            "url": "/rubbos/OlderStories?daysAgo={daysAgo}&page={page}&nbOfStories=20",
            "params": {
                "daysAgo": {"choice": _older_days()},
                "page": ex(r"OlderStories\?day=\d+&month=\d+&year=\d+&page=(\d+)", "random", zero),
            },
        },
        "ViewStory": {
            "url": "/rubbos/ViewStory?storyId={storyId}",
            "params": {"storyId": ex(r"ViewStory\?storyId=(\d+)", "random")},
        },
        "PostComment": {
            "url": "/rubbos/PostComment?comment_table={comment_table}&storyId={storyId}&parent={parent}",
            "params": {
                "comment_table": ex(r"PostComment\?comment_table=(\w+)"),
                "storyId": ex(r"PostComment\?comment_table=\w+&storyId=(\d+)"),
                "parent": ex(r"PostComment\?comment_table=\w+&storyId=\d+&parent=(\d+)", "random"),
            },
        },
        "StoreComment": {
            "method": "POST",
            "url": "/rubbos/StoreComment",
            "form": {
                "comment_table": ex(r'name="comment_table" value="(\w+)"'),
                "storyId": ex(r'name="storyId" value="(\d+)"'),
                "parent": ex(r'name="parent" value="(\d+)"'),
                **login,
                "subject": text(5, 99),
                "body": text(5, 1024),
            },
        },
        "ViewComment": {
            "url": "/rubbos/ViewComment?comment_table={comment_table}&storyId={storyId}&commentId={commentId}&filter={filter}&display={display}",
            "params": {
                "comment_table": ex(r"ViewComment\?comment_table=(\w+)"),
                "storyId": ex(r"ViewComment\?comment_table=\w+&storyId=(\d+)"),
                "commentId": ex(r"ViewComment\?comment_table=\w+&storyId=\d+&commentId=(\d+)", "random"),
                "filter": ex(r"ViewComment\?comment_table=\w+&storyId=\d+&commentId=\d+&filter=(-?\d+)"),
                "display": ex(r"ViewComment\?comment_table=\w+&storyId=\d+&commentId=\d+&filter=-?\d+&display=(\d+)"),
            },
        },
        "ModerateComment": {
            "url": "/rubbos/ModerateComment?comment_table={comment_table}&commentId={commentId}",
            "params": {
                "comment_table": ex(r"ModerateComment\?comment_table=(\w+)"),
                "commentId": ex(r"ModerateComment\?comment_table=\w+&commentId=(\d+)", "random"),
            },
        },
        "StoreModerateLog": {
            "method": "POST",
            "url": "/rubbos/StoreModeratorLog",
            # the original draws -1 or 0 only (digest §2.4); kept for fidelity
            "form": {
                "comment_table": ex(r'name="comment_table" value="(\w+)"'),
                "commentId": ex(r'name="commentId" value="(\d+)"'),
                "rating": {"choice": ["-1", "0"]},
                **login,
            },
        },
        "SubmitStory": {"url": "/rubbos/SubmitStory"},
        "StoreStory": {
            "method": "POST",
            "url": "/rubbos/StoreStory",
            "form": {
                **login,
                "title": text(5, 99),
                "body": text(5, 1024),
                "category": ex(r'<option value="(\d+)">', "random", {"uniform": [0, 84]}),
            },
        },
        "Search": {"url": "/rubbos/Search"},
        "SearchInStories": search(0, {"words_file": "dictionary.txt"}),
        "SearchInComments": search(1, {"words_file": "dictionary.txt"}),
        "SearchInUsers": search(2, "user{sk}"),
        "AuthorLogin": {"url": "/rubbos/author.html"},
        "AuthorTasks": {"method": "POST", "url": "/rubbos/Author", "form": dict(login)},
        "ReviewStories": {"url": "/rubbos/ReviewStories"},
        "AcceptStory": {
            "url": "/rubbos/AcceptStory?storyId={storyId}",
            "params": {"storyId": ex(r"AcceptStory\?storyId=(\d+)", "random")},
        },
        "RejectStory": {
            "url": "/rubbos/RejectStory?storyId={storyId}",
            "params": {"storyId": ex(r"RejectStory\?storyId=(\d+)", "random")},
        },
    }


# --- the workload files ----------------------------------------------------------------------
MIXES = {
    "browse_only": {"user": browse_only, "author": browse_only},
    "read_write": {"user": user_default, "author": author_default},
    "browse_only_no_search": {"user": browse_only_no_search, "author": browse_only_no_search},
    "read_write_no_search": {"user": user_default_no_search, "author": author_default_no_search},
}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        if "'" not in v and ("\\" in v or '"' in v):
            return "'" + v + "'"  # literal string: regular expressions stay readable
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _toml_value(k)


def workload_toml(
    mix: str,
    users: int = 100,
    ramp_up_s: int = 150,
    run_s: int = 900,
    ramp_down_s: int = 150,
    think_mean_s: float = 7.0,
    n_users_db: int = 500_000,
    n_authors_db: int = 50,
    author_weight: float = 0.1,
    words_file: str = "dictionary.txt",
) -> str:
    """The workload file text for one of MIXES (defaults: the original's run of digest §4.1)."""
    if mix not in MIXES:
        raise ValueError(f"mix {mix!r}: expected one of {', '.join(MIXES)}")
    tables = {name: rows_by_page(fn()) for name, fn in MIXES[mix].items()}
    reachable = reachable_pages(tables)
    specs = page_specs()
    L = [
        f"# RUBBoS {mix.replace('_', ' ')} mix for tierscope (docs/workload.md, docs/rubbos.md).",
        "# Written by `python -m tierscope.apps.rubbos.mixes` from the digest's transition tables;",
        "# rows are the from-state (the original files are column-oriented). Do not edit by hand.",
        "",
        "[workload]",
        f'name = "rubbos-{mix.replace("_", "-")}"',
        'start = "StoriesOfTheDay"',
        "max_transitions = 1000",
        'back_on = ["Sorry"]',
        'error_markers = ["ERROR"]',
        "",
        "[think]",
        f"mean_s = {think_mean_s!r}",
        "dispersion = 1.0",
        "",
        "[users]",
        f"count = {users}",
        "",
        "[phases]",
        f"ramp_up_s = {ramp_up_s}",
        f"run_s = {run_s}",
        f"ramp_down_s = {ramp_down_s}",
        "",
        "[connection]",
        'policy = "per-user"',
        "connect_timeout_s = 3.0",
        "request_timeout_s = 30.0",
        "",
        "[session_vars]",
        "# login as user<k>/password<k>; `who` is the nickname prefix (author sessions override it)",
        f"k = {{ uniform = [1, {n_users_db}] }}",
        'who = { choice = ["user"] }',
        "# RegisterUser: a new user number above the loaded users (repeats get the Sorry page)",
        f"reg = {{ uniform = [{n_users_db + 1}, {n_users_db + 1_000_000}] }}",
        "# SearchInUsers searches user<sk>",
        f"sk = {{ uniform = [1, {n_users_db}] }}",
        "",
        "[[session_types]]",
        'name = "user"',
        f"weight = {round(1 - author_weight, 6)!r}",
        'transitions = "user"',
        "",
        "[[session_types]]",
        'name = "author"',
        f"weight = {author_weight!r}",
        'transitions = "author"',
        f'vars = {{ k = {{ uniform = [1, {n_authors_db}] }}, who = {{ choice = ["author"] }} }}',
        "",
    ]
    for page in [PAGE[s] for s in SHORT[:24]]:
        if page not in reachable:
            continue
        spec = specs[page]
        L += [
            "[[pages]]",
            f'name = "{page}"',
            f'method = "{spec.get("method", "GET")}"',
            f"url = {_toml_value(spec['url'])}",
        ]
        for section in ("params", "form"):
            if spec.get(section):
                L.append(f"[pages.{section}]")
                for k, v in spec[section].items():
                    if isinstance(v, dict) and "words_file" in v:
                        v = {"words_file": words_file}
                    L.append(f"{_key(k)} = {_toml_value(v)}")
        L.append("")
    for name, rows in tables.items():
        L.append(f"[transitions.{name}]")
        for src, row in rows.items():
            if src in reachable:
                L.append(f"{src} = {_toml_value(row)}")
        L.append("")
    return "\n".join(L)


def reachable_pages(tables: dict[str, dict[str, Row]], start: str = "StoriesOfTheDay") -> set[str]:
    out = set()
    for rows in tables.values():
        todo, seen = [start], {start}
        while todo:
            s = todo.pop()
            for d, p in rows.get(s, {}).items():
                if p > 0 and d not in ("BACK", "END") and d not in seen:
                    seen.add(d)
                    todo.append(d)
        out |= seen
    return out


def write_all(directory: Path = WORKLOAD_DIR) -> list[Path]:
    out = []
    for mix in MIXES:
        path = directory / f"{mix}.toml"
        path.write_text(workload_toml(mix))
        out.append(path)
    return out


# --- the emulator's walk (digest §2.1, §2.3) --------------------------------------------------
def parse_workload(path: str | Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def simulate_mix(
    rows: dict[str, Row], requests: int, seed: int = 1, start: str = "StoriesOfTheDay", max_transitions: int = 1000
) -> Counter:
    """Pages requested by the RUBBoS walk over a row-oriented table: implicit self-loops for
    rows summing below 1, BACK re-requests the page on top of the history stack (the stack is
    cleared when entering a page whose own BACK probability is 0, else the page left is pushed;
    BACK on an empty stack restarts at the start page), END starts a new session at the start
    page. "Sorry" and error paths are not modelled (as in the digest's derived mixes)."""
    rng = random.Random(seed)
    cum = {}
    for src, row in rows.items():
        acc, items = 0.0, []
        for d, p in row.items():
            acc += p
            items.append((acc, d))
        cum[src] = items
    back_p = {src: row.get("BACK", 0.0) for src, row in rows.items()}
    counts: Counter = Counter()
    stack: list[str]
    cur, stack, n_in_session = start, [], 1
    counts[cur] += 1
    done = 1
    while done < requests:
        u = rng.random()
        nxt = cur  # implicit self-loop
        for acc, d in cum[cur]:
            if u < acc:
                nxt = d
                break
        if nxt == "END" or n_in_session >= max_transitions:
            cur, stack, n_in_session = start, [], 1
        elif nxt == "BACK":
            if stack:
                cur = stack.pop()
                n_in_session += 1
            else:
                cur, stack, n_in_session = start, [], 1
        else:
            if back_p.get(nxt, 0.0) == 0:
                stack = []
            else:
                stack.append(cur)
            cur = nxt
            n_in_session += 1
        counts[cur] += 1
        done += 1
    return counts


def workload_mix(path: str | Path, requests: int = 200_000, seed: int = 1) -> dict[str, float]:
    """The page mix (fractions) a workload file produces: each session type's walk simulated
    for `requests` × its weight requests: in a closed population every emulated user issues
    requests at the same pace (one per think time), so request shares equal the type weights."""
    w = parse_workload(path)
    types = w.get("session_types") or [{"name": "default", "weight": 1.0, "transitions": None}]
    start = w.get("workload", {}).get("start", "StoriesOfTheDay")
    total: Counter = Counter()
    for i, t in enumerate(types):
        tables = w["transitions"]
        rows = tables[t["transitions"]] if t.get("transitions") else tables
        n = int(requests * float(t["weight"]))
        if n:
            total.update(simulate_mix(rows, n, seed + i, start))
    s = sum(total.values())
    return {k: v / s for k, v in total.items()}


if __name__ == "__main__":
    for p in write_all():
        print(p)
