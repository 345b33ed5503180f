"""Routes the tenant listener serves besides the proxied paths: models, receipts, the witnessed
log."""
