"""Moving an answer's bytes from the backend to the client: plain answers (`plain`), streams
(`stream`); what they learn along the way goes to the request's exchange (`gateway.audit`)."""
