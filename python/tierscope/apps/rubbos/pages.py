"""HTML of the RUBBoS pages: the common header (with the logo image the emulator downloads),
the footer, and the four static pages (register, browse, author login, search form).

Links use the original parameter names with plain `&` separators, so the workload's extractors
(regular expressions over the previous page) find them as the original emulator did.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote_plus

from tierscope.apps.web import esc  # the pages' escaping, shared by the apps

PREFIX = "/rubbos"
LOGO = f"{PREFIX}/images/logo.png"
STATIC_DIR = Path(__file__).parent / "static"


def url(script: str, **params) -> str:
    """A link to a dynamic page; parameters in the given order, values URL-encoded."""
    if not params:
        return f"{PREFIX}/{script}"
    return f"{PREFIX}/{script}?" + "&".join(f"{k}={quote_plus(str(v))}" for k, v in params.items())


def header(title: str) -> str:
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>'
        + esc(title)
        + '</title></head>\n<body bgcolor="#ffffff">\n'
        f'<p><a href="{PREFIX}/StoriesOfTheDay"><img src="{LOGO}" width="200" height="68" '
        'alt="RUBBoS logo"></a></p>\n'
        '<table width="100%"><tr>'
        f'<td><a href="{PREFIX}/StoriesOfTheDay">Home</a></td>'
        f'<td><a href="{PREFIX}/register.html">Register</a></td>'
        f'<td><a href="{PREFIX}/browse.html">Browse</a></td>'
        f'<td><a href="{PREFIX}/SubmitStory">Submit a story</a></td>'
        f'<td><a href="{PREFIX}/Search">Search</a></td>'
        f'<td><a href="{PREFIX}/author.html">Author</a></td>'
        "</tr></table>\n<h2>" + esc(title) + "</h2>\n"
    )


def footer(elapsed_ms: float | None = None) -> str:
    t = f"<p><small>Page generated in {elapsed_ms:.1f} ms</small></p>\n" if elapsed_ms is not None else ""
    return "<hr>\n<p>RUBBoS (tierscope)</p>\n" + t + "</body></html>\n"


def page(title: str, body: str, elapsed_ms: float | None = None) -> str:
    return header(title) + body + footer(elapsed_ms)


def search_form() -> str:
    return (
        f'<form action="{PREFIX}/Search" method="get">\n'
        '<p>Search: <input type="text" name="search" size="30"></p>\n'
        '<p><select name="type">'
        '<option value="0">Stories</option><option value="1">Comments</option>'
        '<option value="2">Authors (user names)</option></select>\n'
        '<input type="hidden" name="page" value="0">'
        '<input type="hidden" name="nbOfStories" value="20">'
        '<input type="submit" value="Search"></p>\n</form>\n'
    )


def static_pages() -> dict[str, str]:
    """The static pages by file name (served under /rubbos/)."""
    return {
        "register.html": page(
            "Register a new user",
            f'<form action="{PREFIX}/RegisterUser" method="post">\n'
            '<p>First name <input type="text" name="firstname" maxlength="20"></p>\n'
            '<p>Last name <input type="text" name="lastname" maxlength="20"></p>\n'
            '<p>Nickname <input type="text" name="nickname" maxlength="20"></p>\n'
            '<p>Password <input type="password" name="password" maxlength="20"></p>\n'
            '<p>E-mail <input type="text" name="email" maxlength="50"></p>\n'
            '<p><input type="submit" value="Register now"></p>\n</form>\n',
        ),
        "browse.html": page(
            "Browse",
            f'<p><a href="{PREFIX}/BrowseCategories">Browse stories by category</a></p>\n'
            f'<p><a href="{PREFIX}/OlderStories">Older stories</a></p>\n',
        ),
        "author.html": page(
            "Author login",
            f'<form action="{PREFIX}/Author" method="post">\n'
            '<p>Nickname <input type="text" name="nickname" maxlength="20"></p>\n'
            '<p>Password <input type="password" name="password" maxlength="20"></p>\n'
            '<p><input type="submit" value="Log in"></p>\n</form>\n',
        ),
        "search.html": page("Search", search_form()),
        "index.html": page(
            "RUBBoS bulletin board",
            f'<p><a href="{PREFIX}/StoriesOfTheDay">Stories of the day</a></p>\n',
        ),
    }


def logo_bytes() -> bytes:
    return (STATIC_DIR / "rubbos" / "images" / "logo.png").read_bytes()


def write_static(root: str | Path) -> Path:
    """Write the static pages and the logo under `root`/rubbos/ (an nginx document root)."""
    base = Path(root) / "rubbos"
    (base / "images").mkdir(parents=True, exist_ok=True)
    for name, text in static_pages().items():
        (base / name).write_text(text)
    (base / "images" / "logo.png").write_bytes(logo_bytes())
    return Path(root)
