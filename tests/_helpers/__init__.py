"""Fixtures shared by test modules of different folders (a tiny TTA classifier, TULIP tower sizes, the hung-test
harness): one copy each, imported by the tests that use them."""
