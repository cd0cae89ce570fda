from django.urls import path
from orders import views

urlpatterns = [
    path("orders", views.place_order),
    path("orders/<int:order_id>", views.read_order),
    path("async/orders", views.place_order_async),
]
