# The Faultline service image. CPU only: torch comes from the CPU wheel index first, so the
# project's own range resolves to it instead of pulling CUDA builds.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1
WORKDIR /app
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY service ./service
COPY agents ./agents
COPY rules ./rules
COPY prompts ./prompts
RUN pip install '.[server]'
RUN useradd --create-home faultline
USER faultline
ENV FAULTLINE_DATA_DIR=/home/faultline/data
# made here so a named volume mounted on it (the sidecar's offsets) belongs to the user
RUN mkdir -p /home/faultline/data
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz').status != 200)"
CMD ["faultline", "serve", "--host", "0.0.0.0", "--port", "8080"]
