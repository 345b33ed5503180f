"""The response side: one pure judge (`judge`: context + answer -> verdict), one settle step
(`settle`: verdict -> the client's answer and one audit record), the HMAC-chained log (`log`,
`sink`) and its verifier (`verify`, `cli`)."""
