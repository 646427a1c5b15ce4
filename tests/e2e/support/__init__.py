"""What the end-to-end tests share: processes they start and stop (processes.py), an Airflow API server of
their own and its REST API (airflow_server.py), and headless Chromium driven over the DevTools protocol
(browser.py)."""
