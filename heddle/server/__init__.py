"""The OpenAI-compatible HTTP server: FastAPI app, schemas, streaming and Prometheus metrics.

`build_app(async_engine, ...)` makes the ASGI app; `run_server(...)` serves it with uvicorn.
"""
