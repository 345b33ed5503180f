"""kvfence backend: a torch inference server whose KV pool is reachable only through signed
handles."""
