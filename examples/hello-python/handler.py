"""A minimal sless function: greets whoever is named in the request."""


def handle(event):
    body = event.get("body") if isinstance(event, dict) and "method" in event else event
    name = body.get("name", "world") if isinstance(body, dict) else "world"
    print(f"greeting {name}")
    return {"message": f"Hello, {name}!"}
