"""The ASGI middleware around the app, outermost first: CORS (`cors`), request ids and the last-resort
500 (`request_ids`), tracing spans (`tracing`), trailing slashes (`trailing_slash`).

Pure ASGI, never Starlette's BaseHTTPMiddleware: it would buffer streams and break cancellation.
"""
