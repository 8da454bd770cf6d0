"""fake_devices.kubeletplugin.startup: when a started plugin counts as up (serving and registered)."""

import pytest

from fake_devices.kubeletplugin import startup

DRIVER = "gpu.example.com"
SERVING = "2026-12-07 10:00:00,000 INFO MainThread published 1 slice\nready\n"
REGISTERED = f"2026-12-07 10:00:01,000 INFO grpc registered with the kubelet as {DRIVER}\n"


def test_serving_is_not_enough_the_kubelet_must_have_registered_it():
    assert not startup.registered(SERVING, DRIVER)
    assert startup.registered(SERVING + REGISTERED, DRIVER)


def test_registration_may_come_before_the_ready_line_but_both_are_needed():
    assert startup.registered(REGISTERED + SERVING, DRIVER)
    assert not startup.registered(REGISTERED, DRIVER)


def test_another_drivers_registration_does_not_count():
    assert not startup.registered(SERVING + REGISTERED.replace(DRIVER, "nic.example.com"), DRIVER)
    # names that start or end like ours are other drivers too
    assert not startup.registered(SERVING + REGISTERED.replace(DRIVER, DRIVER + ".eu"), DRIVER)
    assert not startup.registered(SERVING + REGISTERED.replace(DRIVER, DRIVER[:-4]), DRIVER)


def test_a_refusal_raises_with_the_kubelets_answer():
    refused = "x ERROR grpc " + startup.REFUSED.format(driver=DRIVER, error="unsupported versions [v9]") + "\n"
    with pytest.raises(startup.RegistrationRefused, match=r"refused registration of gpu\.example\.com: unsupported"):
        startup.registered(SERVING + refused, DRIVER)


def test_the_ready_line_is_a_whole_line_not_part_of_a_message():
    assert not startup.registered("not ready yet\n" + REGISTERED, DRIVER)
