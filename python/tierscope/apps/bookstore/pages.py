"""HTML of the bookstore pages: the common header (TPC logo and the page's buttons, all GIFs under
/tpcw/img/ that nginx serves), the promotional strip, links and the footer.

Every link to a dynamic page carries the session state as URL parameters, `C_ID` and
`SHOPPING_ID` (when known), after the page's own parameters, with plain `&` separators, e.g.
`/tpcw/ProductDetail?I_ID=123&C_ID=7&SHOPPING_ID=42`, so an emulator finds `I_ID=`, `C_ID=` and
`SHOPPING_ID=` in the previous page as the TPC-W RBE did.
"""

from __future__ import annotations

from urllib.parse import quote_plus

from tierscope.apps.web import esc  # the pages' escaping, shared by the apps

PREFIX = "/tpcw"
IMG = f"{PREFIX}/img"

#: the static GIFs of the original (TPC-W `images/`), served by nginx as /tpcw/img/<name>.gif
STATIC_GIFS = (
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
)


def url(script: str, **params) -> str:
    """A link to a dynamic page; parameters whose value is None or "" are left out."""
    kept = [(k, v) for k, v in params.items() if v is not None and v != ""]
    if not kept:
        return f"{PREFIX}/{script}"
    return f"{PREFIX}/{script}?" + "&".join(f"{k}={quote_plus(str(v))}" for k, v in kept)


def img(path: str, alt: str = "", width: int | None = None, height: int | None = None) -> str:
    """An image under /tpcw/img/ (`path` as stored in the database, e.g. img5/thumb_105.gif)."""
    size = (f' width="{width}"' if width else "") + (f' height="{height}"' if height else "")
    return f'<img src="{IMG}/{esc(path)}" alt="{esc(alt)}"{size}>'


def gif(name: str, alt: str = "") -> str:
    return img(f"{name}.gif", alt or name)


def button(href: str, name: str, alt: str) -> str:
    return f'<a href="{href}">{gif(name, alt)}</a>'


def hidden(**fields) -> str:
    return "".join(
        f'<input type="hidden" name="{k}" value="{esc(v)}">' for k, v in fields.items() if v is not None and v != ""
    )


def header(title: str, buttons: str) -> str:
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>TPC-W '
        + esc(title)
        + '</title></head>\n<body bgcolor="#ffffff">\n<p>'
        + gif("tpclogo", "TPC-W bookstore")
        + "</p>\n<h2>"
        + esc(title)
        + "</h2>\n"
        + (f"<p>{buttons}</p>\n" if buttons else "")
    )


def footer(elapsed_ms: float | None = None) -> str:
    t = f"<p><small>Page generated in {elapsed_ms:.1f} ms</small></p>\n" if elapsed_ms is not None else ""
    return "<hr>\n<p>TPC-W bookstore (tierscope)</p>\n" + t + "</body></html>\n"


def page(title: str, body: str, buttons: str = "", elapsed_ms: float | None = None) -> str:
    return header(title, buttons) + body + footer(elapsed_ms)


def promo_strip(rows: list[dict], link) -> str:
    """The promotional strip: up to 5 thumbnails (100x150) linking to Product Detail."""
    if not rows:
        return ""
    cells = "".join(
        f'<td><a href="{link("ProductDetail", I_ID=r["i_id"])}">{img(r["i_thumbnail"], "promotion", 100, 150)}</a></td>'
        for r in rows
    )
    return f'<table class="promo"><tr><td>Click on one of our latest books to find out more!</td>{cells}</tr></table>\n'


def money(x) -> str:
    return f"{float(x or 0):.2f}"
