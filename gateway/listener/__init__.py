"""The tenant listener before the app: requests it cannot frame are refused (`edge`), and
connections beyond its caps make room or are answered 503 (`connections`)."""
