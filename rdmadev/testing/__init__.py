"""Test and demo infrastructure: a loopback TF cluster launcher (launch) and the two-process
bootstrap over a pipe (pair)."""
