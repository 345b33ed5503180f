"""The response side: the exchange (`exchange`: the one object a relay talks to), one pure judge
(`judge`: context + answer -> verdict), one settle step (`settle`: verdict -> the client's
answer, one audit record, metrics, the watch), the readers of usage and events, the open log
(`sink`), and the HMAC-chained log with its verifier (`chain`, `cli`)."""
