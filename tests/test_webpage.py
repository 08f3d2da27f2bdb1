"""The web page in headless Chromium (Debian's chromium + chromium-driver, driven by selenium)."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from serve_helpers import make_tiny_bundle, running_server

from asr.audio import featurize
from asr.bundle import load_bundle
from asr.longform import Transcriber
from serve.app import create_app
from serve.config import ServeConfig

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
CHROME_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--use-fake-ui-for-media-stream",  # grant the microphone without a prompt
    "--use-fake-device-for-media-stream",  # a synthetic microphone (a beep), so recording runs headless
)
WAIT_S = 60
RECORD_S = 1.5

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian packages chromium and chromium-driver (make test-sysdeps)",
)


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in CHROME_ARGS:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_uploading_a_wav_shows_its_transcript_and_timing(browser, tmp_path, sentences_file, speech_corpus):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    manifest = speech_corpus["test"]
    wav = manifest.parent / json.loads(manifest.open(encoding="utf-8").readline())["audio"]
    bundle_path = make_tiny_bundle(tmp_path, sentences_file)
    bundle = load_bundle(bundle_path)
    want = Transcriber.from_bundle(bundle)([featurize(wav, bundle.feature)])[0].text

    with running_server(create_app(ServeConfig(model=str(bundle_path)), bundle)) as url:
        browser.get(url + "/")
        browser.find_element(By.ID, "file").send_keys(str(wav))
        browser.find_element(By.ID, "transcribe-file").click()
        transcript = browser.find_element(By.ID, "transcript")
        WebDriverWait(browser, WAIT_S).until(
            lambda _: transcript.get_attribute("data-state") in ("done", "error")
        )
        assert browser.find_element(By.ID, "error").text == ""
        assert transcript.text == want
        assert "s of audio transcribed in" in browser.find_element(By.ID, "timing").text
        assert len(browser.find_elements(By.CSS_SELECTOR, "#segments li")) >= (1 if want else 0)


def test_page_reports_server_errors(browser, tmp_path, sentences_file):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("this is not audio\n" * 50)
    bundle_path = make_tiny_bundle(tmp_path, sentences_file)
    with running_server(create_app(ServeConfig(model=str(bundle_path)))) as url:
        browser.get(url + "/")
        browser.find_element(By.ID, "file").send_keys(str(not_audio))
        browser.find_element(By.ID, "transcribe-file").click()
        transcript = browser.find_element(By.ID, "transcript")
        WebDriverWait(browser, WAIT_S).until(lambda _: transcript.get_attribute("data-state") == "error")
        assert "Unsupported" in browser.find_element(By.ID, "error").text


def test_recording_from_the_microphone_uploads_a_wav(browser, tmp_path, sentences_file):
    """The page records PCM through WebAudio, encodes a WAV in JavaScript, and the server accepts it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    bundle_path = make_tiny_bundle(tmp_path, sentences_file)
    with running_server(create_app(ServeConfig(model=str(bundle_path)))) as url:
        browser.get(url + "/")
        browser.find_element(By.ID, "record").click()
        WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element(By.ID, "stop").is_enabled())
        time.sleep(RECORD_S)
        browser.find_element(By.ID, "stop").click()
        transcript = browser.find_element(By.ID, "transcript")
        WebDriverWait(browser, WAIT_S).until(
            lambda _: transcript.get_attribute("data-state") in ("done", "error")
        )
        assert browser.find_element(By.ID, "error").text == ""
        timing = browser.find_element(By.ID, "timing").text
        seconds = float(timing.split(" s of audio")[0])
        assert RECORD_S * 0.5 < seconds < RECORD_S + 5  # the recorded length, give or take start-up
