from django.db import models


class Order(models.Model):
    """An order; saved if and only if its ``django-orders`` message is published."""

    order_id = models.PositiveIntegerField(primary_key=True)
    transaction_id = models.CharField(max_length=64, unique=True)
    customer = models.CharField(max_length=100)
    amount = models.DecimalField(max_digits=12, decimal_places=2)


class Invoice(models.Model):
    """What the billing consumer makes of an order: one invoice per order, however often the order is delivered."""

    order_id = models.PositiveIntegerField(primary_key=True)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
