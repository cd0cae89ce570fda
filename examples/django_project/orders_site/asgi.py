"""ASGI entry point (``uvicorn orders_site.asgi:application``): the sync views in threads, the async view on the loop,
with the asyncio producer started on that loop at its first use."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orders_site.settings")
application = get_asgi_application()
