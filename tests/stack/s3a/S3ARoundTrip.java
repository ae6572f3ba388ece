// Run by tests/stack/test_s3a_jars.py with `java -cp <PySpark's jars>:<the S3A jars> S3ARoundTrip.java ENDPOINT
// BUCKET PREFIX REGION` (the JDK's single-file launcher; no Spark): Hadoop's S3A, as a Spark job has it, writes,
// renames, uploads a local file (the SDK's transfer manager, whose async client is the SDK's Netty client on
// PySpark's Netty), reads both back and deletes them. Keys: AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY (S3A's default chain, as the job runtime uses it).
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

public class S3ARoundTrip {
  public static void main(String[] args) throws Exception {
    String endpoint = args[0], bucket = args[1], prefix = args[2], region = args[3];
    Configuration conf = new Configuration();
    String b = "fs.s3a.bucket." + bucket + ".";
    conf.set(b + "endpoint", endpoint);
    conf.set(b + "endpoint.region", region);
    conf.set(b + "path.style.access", "true");
    conf.set(b + "connection.ssl.enabled", String.valueOf(endpoint.startsWith("https://")));
    conf.set("fs.s3a.retry.limit", "2");
    Path base = new Path("s3a://" + bucket + prefix);
    try (FileSystem fs = FileSystem.get(base.toUri(), conf)) {
      Path written = new Path(base, "written");
      try (FSDataOutputStream out = fs.create(written, true)) {
        out.write("through S3A".getBytes(StandardCharsets.UTF_8));
      }
      System.out.println("WROTE " + fs.getFileStatus(written).getLen());
      Path renamed = new Path(base, "renamed");
      if (!fs.rename(written, renamed)) {
        throw new IllegalStateException("rename returned false");
      }
      System.out.println("RENAMED " + fs.exists(written) + " " + fs.exists(renamed));
      java.nio.file.Path local = Files.createTempFile("s3a-round-trip", ".txt");
      Files.writeString(local, "uploaded from a local file");
      Path uploaded = new Path(base, "uploaded");
      fs.copyFromLocalFile(true, true, new Path(local.toUri()), uploaded);
      for (Path p : new Path[] {renamed, uploaded}) {
        try (FSDataInputStream in = fs.open(p)) {
          System.out.println("READ " + new String(in.readAllBytes(), StandardCharsets.UTF_8));
        }
      }
      System.out.println("DELETED " + fs.delete(base, true));
    }
  }
}
