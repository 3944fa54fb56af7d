"""The alert driver: the webhook payload and Alertmanager's v2 API, posted and resent."""
