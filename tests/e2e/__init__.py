"""End-to-end tests on the local lab: fixtures in conftest.py, shared helpers in lab_helpers.py."""
