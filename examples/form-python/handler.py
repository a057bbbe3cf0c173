"""Serves an HTML form on GET and answers its POST: form fields arrive in event["body"]."""

import html

FORM = """<!doctype html>
<html><head><meta charset="utf-8"><title>Guestbook</title></head>
<body>
<h1>Sign the guestbook</h1>
<form method="post">
  <label>Name <input name="name" required></label>
  <label>Message <input name="message"></label>
  <button type="submit">Sign</button>
</form>
</body></html>
"""


def handle(event):
    if event.get("method") != "POST":
        return FORM
    fields = event.get("body") if isinstance(event.get("body"), dict) else {}
    name = html.escape(fields.get("name", "").strip())
    if not name:
        return {"statusCode": 400, "headers": {"Content-Type": "text/html; charset=utf-8"},
                "body": "<p>Please give your name.</p>"}
    message = html.escape(fields.get("message", ""))
    print(f"signed by {name}")
    return f"<!doctype html><p>Thank you, <b>{name}</b>!</p><blockquote>{message}</blockquote>"
