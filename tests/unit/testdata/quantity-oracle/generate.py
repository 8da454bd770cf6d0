"""Regenerate ../quantities-go.json: what k8s.io/apimachinery v0.37.2's ParseQuantity says about
a fixed list of strings plus 1500 random ones (seeded), so fake_devices.quantity is tested against the
real parser without needing Go at test time.

    cd tests/unit/testdata/quantity-oracle && go build -o /tmp/quantity-oracle . && python generate.py /tmp/quantity-oracle

Exponents of more than 3 digits are kept out of the value comparison: the Go parser needs seconds to
minutes for those (1e-2147483648 never returns), which is one reason fake_devices.quantity refuses them.
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

HAND = ["1Ti", "１Ti", "1e9", "1E3", "1e-3", "1e+3", "+1", "-1", ".5", "5.", "1.5Gi", "0.5Ki", "1Ki", "1e", "1i", "1KiB",
        "1K", "1n", "1u", "12345678901234567890", "+", "-", ".", "+.", "0", "00", "000Gi", "", " 1", "1 ", "1.2.3", "1..",
        "1e3e", "1Ki5", "1E", "1e+", "1e-", "E3", "e3", "1EE3", "1ee3", "1m3", "1.5e3", "1.5E-3", "0.0001n", "1e-40",
        "9223372036854775807", "9223372036854775808", "8Ei", "7Ei", "8191Pi", "0x10", "1_000", "١", "1٣", "Inf", "NaN",
        "1e400", "1.0e+400", "3840G", "400G", "80Gi", "16", "1Pi", "1Ei", "10Ei", "1.Gi", ".Gi", "Gi", "-0", "+0",
        "-0.0Gi", "1mi", "1Mi", "1MI", "1gi", "1ki", "1k", "1e0", "1e-0", "1E+0", "12e6", "0.000000001", "0.0000000001",
        "1e+99", "1e-99", "1e999", "Pi", "+Pi", ".Pi", "0.Pi", "00.Pi", "+.Pi", "-Pi", "1.Pi", ".5Pi", "5.Pi", "0.Ei",
        "Ei", "+.Ei", "1.5Ei", "1234567890123456789.", "1234567890123456789.e3", "+.1234567890123456789", "-.", ".e3",
        ".E", "+.Ki", "1234567890123456789Pi", "0Pi", "-0Pi", "000.0Pi", "１", "1Ｋi", "1\u00a0Gi", "٣Gi"]
# only whether they parse (their values take the Go parser a long time to print)
HUGE = ["1e99999999", "1e9999999999", "1e99999999999999999999", "1e2147483647", "1e4294967296", "1E-99999"]
ALPHABET = "0123456789.+-eEinumkKMGTPi"


def random_cases(count: int) -> list[str]:
    rng = random.Random(16)
    cases: set[str] = set()
    while len(cases) < count:
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8)))
        exponent = text.lstrip("+-0123456789.").lstrip("eE+-")
        if not (text.lstrip("+-0123456789.")[:1] in ("e", "E") and len(exponent) > 3):
            cases.add(text)
    return sorted(cases)


def ask(oracle: str, cases: list[str], values: bool) -> list[dict]:
    env = {**os.environ, **({} if values else {"NODEC": "1"})}
    out = subprocess.run([oracle], input="".join(json.dumps(c) + "\n" for c in cases), capture_output=True, text=True,
                         env=env, timeout=300, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


if __name__ == "__main__":
    rows = ask(sys.argv[1], HAND + random_cases(1500), True) + ask(sys.argv[1], HUGE, False)
    target = Path(__file__).resolve().parent.parent / "quantities-go.json"
    target.write_text("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False, sort_keys=True) for r in rows) + "\n]\n")
    print(f"{len(rows)} cases, {sum(r['ok'] for r in rows)} accepted -> {target}")
