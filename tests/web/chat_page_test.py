#!/usr/bin/env python3
"""Drives the chat page at / in headless Chromium (Debian's chromium + chromium-driver, through
selenium): the page loads with the model's name, a typed message streams a reply (text grows
while it arrives), the reply ends with its usage line, a second message carries the history,
and Stop ends a long reply early. Usage: chat_page_test.py URL [--api-key K] [--screenshot PNG]."""
import argparse
import sys
import time

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--screenshot")
    ap.add_argument("--api-key", help="typed into the page's API key field, as a user would")
    ap.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    args = ap.parse_args()
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,800", "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(args.chromedriver), options=opts)
    wait = WebDriverWait(d, 60, poll_frequency=0.02)
    try:
        d.get(args.url)
        assert d.title == "moeserve", d.title
        if args.api_key:
            from selenium.webdriver.common.keys import Keys
            d.find_element(By.ID, "api_key").send_keys(args.api_key + Keys.TAB)
        wait.until(lambda d: d.find_element(By.ID, "model").text not in ("", "…"))
        model = d.find_element(By.ID, "model").text
        assert model == "tiny-py", model

        # A reply streams in: its text is seen growing before the reply is done. Greedy: a
        # sampled reply need not re-tokenize to the tokens it was sampled as (BPE merges another
        # way), and then the second turn's prompt shares no whole block with the first's.
        d.find_element(By.ID, "temperature").clear()
        d.find_element(By.ID, "temperature").send_keys("0")
        d.find_element(By.ID, "max_tokens").clear()
        d.find_element(By.ID, "max_tokens").send_keys("160")
        d.find_element(By.ID, "ignore_eos").click()
        d.find_element(By.ID, "prompt").send_keys("Write a Python function that reverses a list.")
        d.find_element(By.ID, "send").click()
        replies = lambda: d.find_elements(By.CSS_SELECTOR, ".msg.assistant")
        wait.until(lambda d: len(replies()) == 1)
        seen = []
        deadline = time.time() + 60
        while time.time() < deadline:
            r = replies()[0]
            state = r.get_attribute("data-state")
            text = r.find_element(By.CSS_SELECTOR, ".content").text
            if text and (not seen or seen[-1] != len(text)):
                seen.append(len(text))
            if state == "done":
                break
            time.sleep(0.01)
        assert replies()[0].get_attribute("data-state") == "done", "the reply did not finish"
        assert len(seen) >= 3 and seen[0] < seen[-1], f"not streamed: text lengths {seen}"
        usage = replies()[0].find_element(By.CSS_SELECTOR, ".usage").text
        assert "reply 160 tokens" in usage and "finish: length" in usage, usage
        print(f"streamed: {len(seen)} distinct lengths up to {seen[-1]} chars; usage: {usage}")

        # The second turn: its prompt includes the first (the prefix cache serves some of it).
        d.find_element(By.ID, "max_tokens").clear()
        d.find_element(By.ID, "max_tokens").send_keys("8")
        d.find_element(By.ID, "prompt").send_keys("Thanks.")
        d.find_element(By.ID, "send").click()
        wait.until(lambda d: len(replies()) == 2 and replies()[1].get_attribute("data-state") == "done")
        usage2 = replies()[1].find_element(By.CSS_SELECTOR, ".usage").text
        prompt_tokens = int(usage2.split("prompt ")[1].split(" ")[0])
        assert prompt_tokens > 160, usage2
        cached = int(usage2.split("(")[1].split(" ")[0])
        assert cached > 0, usage2
        print(f"second turn: {usage2}")
        if args.screenshot:
            d.save_screenshot(args.screenshot)

        # Stop: a long reply ends early, marked stopped, and Send works again.
        d.find_element(By.ID, "max_tokens").clear()
        d.find_element(By.ID, "max_tokens").send_keys("4000")
        d.find_element(By.ID, "prompt").send_keys("And now a long story.")
        d.find_element(By.ID, "send").click()
        wait.until(lambda d: len(replies()) == 3 and
                   replies()[2].find_element(By.CSS_SELECTOR, ".content").text)
        d.find_element(By.ID, "stop").click()
        wait.until(lambda d: replies()[2].get_attribute("data-state") == "stopped")
        n = len(replies()[2].find_element(By.CSS_SELECTOR, ".content").text)
        time.sleep(0.5)
        assert len(replies()[2].find_element(By.CSS_SELECTOR, ".content").text) == n, "kept growing"
        assert d.find_element(By.ID, "send").is_enabled()
        assert not d.find_element(By.ID, "stop").is_enabled()
        print(f"stopped after {n} chars")
        # (the model list asked for before the key was typed is refused: expected)
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE" and
                  not ("/v1/models" in e["message"] and "401" in e["message"])]
        assert not errors, errors
    finally:
        d.quit()
    print("PASS")


if __name__ == "__main__":
    sys.exit(main())
