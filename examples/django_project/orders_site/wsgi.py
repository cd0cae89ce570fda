"""WSGI entry point (``gunicorn orders_site.wsgi``): the sync views; the async one needs an ASGI server."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orders_site.settings")
application = get_wsgi_application()
