"""Packaging for QMQ, the Quick Message Queue.

``twisted/plugins`` has no ``__init__.py`` (Twisted's plugin rule), so it is
listed by hand; ``package_dir={"": "."}`` keeps editable installs a plain path
entry so ``twistd`` finds the plugin after ``pip install -e .`` as well.
"""

from setuptools import find_packages, setup

setup(
    name="qmq",
    version="0.1.0",
    description="QMQ, the Quick Message Queue: a light, robust and quick message broker on Twisted",
    long_description=open("README.rst", encoding="utf-8").read(),
    long_description_content_type="text/x-rst",
    license="MIT",
    python_requires=">=3.11",
    package_dir={"": "."},
    packages=find_packages(include=["qmq", "qmq.*"]) + ["twisted.plugins"],
    package_data={
        "qmq": ["default.toml", "web/static/*", "web/static/console/*", "web/examples/*", "web/api/schemas/*.avsc"],
        "twisted.plugins": ["qmq_plugin.py", "qmq_endpoints.py"],
    },
    include_package_data=True,
    install_requires=[
        "twisted[tls]>=24.7",
        "pyopenssl>=24.0",
        "service-identity>=24.1",
        "autobahn>=24.4,<27",
        "avro>=1.11",
        "fastavro>=1.9",
        "orjson>=3.9",
        "prometheus-client>=0.20",
        "pyjwt[crypto]>=2.8",
        "pamqp>=3.3",
    ],
    entry_points={
        "console_scripts": [
            "qmq-store = qmq.store.tool:main_exit",
            "qmq-passwd = qmq.auth.passwords:main_exit",
            "qmq-spark = qmq.spark.jobs:main_exit",
            "qmq-ctl = qmq.ctl:main_exit",
        ]
    },
    extras_require={
        "test": [
            "stomp.py>=8.1",
            "trustme>=1.1",
            "hypothesis>=6.100",
            "ruff>=0.5",
            "sphinx>=7.2",
            "treq>=23.1",
            "schemathesis>=4.0",
            # AMQP 0-9-1 clients the integration tests drive (qmq.amqp).
            "pika>=1.3",
            "kombu>=5.3",
            "celery>=5.3",
            "aio-pika>=9.4",
        ],
        "bench": ["matplotlib>=3.8"],
        # The Spark data source and jobs (qmq.spark); the broker never imports them.
        "spark": ["pyspark==4.3.0", "pyarrow>=15", "matplotlib>=3.8"],
    },
    classifiers=[
        "Framework :: Twisted",
        "Programming Language :: Python :: 3",
        "Topic :: System :: Networking",
    ],
)
