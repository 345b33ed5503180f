"""The one-call GPU check (engine, transformers beside it, roofline, gateway) and its carry."""
