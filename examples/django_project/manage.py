#!/usr/bin/env python
"""The example's command line: ``python manage.py migrate``, ``runserver``, ``bill_orders``."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orders_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
