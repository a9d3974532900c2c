"""Tests of the generic reconciler."""
